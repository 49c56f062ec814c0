"""The ``reinforge`` command line (argparse: core depends on pluggy only)."""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import sys
import time
from typing import Any

from .errors import ReinforgeError

ROLES = {"workflow": "workflow", "judge": "judge", "group-reward": "group_reward"}


def _parser(pm: Any = None) -> argparse.ArgumentParser:
    from .__about__ import __version__

    p = argparse.ArgumentParser(prog="reinforge", description="Reinforcement fine-tuning for LLM agents.")
    p.add_argument("--version", action="version", version=f"reinforge {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    sp = sub.add_parser("plugins", help="installed plugins, versions and what each registers")
    sp.add_argument("--json", action="store_true", help="print JSON")
    sp.add_argument(
        "--check", action="store_true", help="exit 1 when a plugin is broken or two plugins register the same name (CI)"
    )

    sp = sub.add_parser("tune", help="train: run a run file on a backend")
    sp.add_argument("run_file")
    sp.add_argument("--backend", help="backend name (default: the run file's, else 'local')")
    sp.add_argument("--dry-run", action="store_true", help="resolve and validate everything, train nothing")
    sp.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its latest checkpoint")

    sp = sub.add_parser("eval", help="workflow + judges over a split, no training")
    sp.add_argument("run_file")
    sp.add_argument("--split")
    sp.add_argument("--limit", type=int)
    sp.add_argument("--api-base", help="evaluate the model behind this OpenAI-compatible URL (through litellm)")
    sp.add_argument("--model", dest="model_name", help="model name for --api-base / litellm")
    sp.add_argument("--output", help="write the summary and every trajectory to this JSON file")
    sp.add_argument("--json", action="store_true", help="print the summary as JSON (last line)")

    sp = sub.add_parser("try", help="run one function on one input and show what it did")
    sp.add_argument("role", choices=sorted(ROLES))
    sp.add_argument("ref", help="registered name or module:attr")
    sp.add_argument("--input", required=True, help="JSON input (ours or DashScope's test-input format)")
    sp.add_argument("--args", default="{}", help="JSON object of settings for the function")
    sp.add_argument("--judge", action="append", default=[], help="with 'try workflow': also score with this judge")
    sp.add_argument("--api-base", help="model endpoint for 'try workflow'")
    sp.add_argument("--model", dest="model_name", help="model name for 'try workflow'")
    sp.add_argument("--timeout", type=float, default=600.0)

    p.set_defaults(run=None)
    commands = _add_plugin_commands(sub, pm) if pm is not None else set()
    taken = {command.split()[0] for command in commands}
    for name, package in PACKAGE_COMMANDS.items():  # "belongs to package X" instead of argparse's "invalid choice"
        if name not in taken:
            sp = sub.add_parser(name, help=f"(needs {package})")
            sp.add_argument("rest", nargs=argparse.REMAINDER)
            sp.set_defaults(run=functools.partial(_package_missing, name, package))
    return p


# The commands the monorepo's own packages add (register_commands), so that a missing one is named; a
# third-party command that is not installed is argparse's "invalid choice", as any unknown word.
PACKAGE_COMMANDS = {
    "report": "reinforge-report",
    "serve": "reinforge-backend-local",
    "export": "reinforge-backend-local",
    "online": "reinforge-online",
    "judge": "reinforge-judges-llm",
}


def _package_missing(name: str, package: str, args: argparse.Namespace) -> int:
    folder = package.removeprefix("reinforge-")
    print(
        f"error: 'reinforge {name}' is a command of the {package} package, which is not installed here: "
        f"pip install ./packages/{folder} from a checkout (its README, Install)",
        file=sys.stderr,
    )
    return 1


def _add_plugin_commands(sub: Any, pm: Any) -> set[str]:
    """Subcommands from ``register_commands`` hooks, e.g. ``reinforge judge audit``; returns their names."""
    groups: dict[str, Any] = {}
    added: set[str] = set()

    def register(name: str, run: Any, *, help: str = "", arguments: Any = None) -> None:
        words = name.split()
        target = sub
        if len(words) > 1:
            if words[0] not in groups:
                groups[words[0]] = sub.add_parser(words[0], help=f"{words[0]} commands").add_subparsers(
                    dest="subcommand", required=True
                )
            target = groups[words[0]]
        parser = target.add_parser(words[-1], help=help)
        if arguments is not None:
            arguments(parser)
        parser.set_defaults(run=run)
        added.add(name)

    pm.hook.register_commands(register=register)
    return added


def main(argv: list[str] | None = None) -> int:
    from .plugins import get_plugin_manager

    try:
        pm = get_plugin_manager()
    except ReinforgeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    args = _parser(pm).parse_args(argv)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # `module:attr` refs given on the command line resolve from here
    try:
        if args.run is not None:
            return int(args.run(args) or 0)
        return {"plugins": cmd_plugins, "tune": cmd_tune, "eval": cmd_eval, "try": cmd_try}[args.command](args)
    except ReinforgeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


# -- plugins --------------------------------------------------------------------------------


def cmd_plugins(args: argparse.Namespace) -> int:
    """List the plugins; with ``--check``, exit 1 naming each broken plugin and each name claimed twice."""
    from .plugins import get_plugin_manager, plugin_problems

    rows, problems = plugin_problems(get_plugin_manager())
    if args.json:
        print(json.dumps(rows, indent=2))
        return _check_result(problems) if args.check else 0
    for row in rows:
        print(f"{row['name']} {row['version'] or ''}".rstrip() + (" [broken]" if row["broken"] else ""))
        if row["broken"]:
            print(f"  broken: {row['broken']}")
        for kind, names in sorted(row["registers"].items()):
            print(f"  {kind}: {', '.join(sorted(names))}")
        for conflict in row["conflicts"]:
            print(f"  conflict: {conflict}")
        if not row["registers"] and not row["broken"]:
            print(f"  hooks: {', '.join(row['hooks']) or '-'}")
    return _check_result(problems) if args.check else 0


def _check_result(problems: list[str]) -> int:
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        print(f"reinforge plugins --check: {len(problems)} problem(s)", file=sys.stderr)
    return 1 if problems else 0


# -- tune / eval ------------------------------------------------------------------------------


def _dataset_rows(run: Any) -> dict[str, Any]:
    """Load the run's datasets and count their rows (what ``tune --dry-run`` checks)."""
    out: dict[str, Any] = {}
    for key in ("train_dataset", "eval_dataset"):
        ds = getattr(run, key)
        if ds is None:
            continue
        out[key] = {"path": ds.path, "split": ds.split, "read": ds.describe(), "rows": len(ds.load())}
    return out


def cmd_tune(args: argparse.Namespace) -> int:
    from .job import build_job
    from .runfile import load_run
    from .tuning import run_job

    run = load_run(args.run_file)
    if args.resume:
        run.backend_args = {**run.backend_args, "resume": args.resume}
    job = build_job(run, backend=args.backend, need_backend=True)
    datasets: dict[str, Any] = {}
    if args.dry_run:
        try:
            datasets = _dataset_rows(run)  # a dry run that passes must mean the data loads too
        except BaseException:
            job.close()
            raise
    result = run_job(job, dry_run=args.dry_run)
    if args.dry_run:
        if isinstance(result, dict):
            print(json.dumps({**result, "datasets": datasets}, indent=2, default=str))
        else:
            print(result)
            for key, info in datasets.items():
                print(f"{key}: {info['rows']} rows ({info['read']})")
    return 0


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def cmd_eval(args: argparse.Namespace) -> int:
    from .evaluation import evaluate
    from .runfile import load_run

    run = load_run(args.run_file)
    report = evaluate(run, split=args.split, limit=args.limit, api_base=args.api_base, model_name=args.model_name)
    summary = report.summary()
    m = report.metrics
    read = f"{report.dataset} (the whole file)" if report.split is None else f"split {report.split} of {report.dataset}"
    print(f"eval {args.run_file}: {read}, {report.tasks} tasks, {report.kept} scored, {report.seconds:.1f}s")
    print(f"  accuracy ({report.accuracy_key} >= {report.threshold:g}): {_fmt(report.accuracy)}")
    for dim in report.dimensions:
        stats = "  ".join(f"{s} {_fmt(m.get(f'{dim}/{s}'))}" for s in ("mean", "std", "min", "max"))
        print(f"  {dim:<32} {stats}")
    counters = ", ".join(f"{k} {v}" for k, v in sorted(report.counters.items())) or "none"
    print(f"  counters: {counters}")
    if args.output:
        records = report.trajectory_records()
        with open(args.output, "w") as fh:
            json.dump({"summary": summary, "trajectories": records}, fh, default=str)
        print(f"  wrote {args.output} ({len(records)} trajectories, {report.discarded} discarded)")
    if args.json:
        print(json.dumps(summary, default=str))
    return 0


# -- try ----------------------------------------------------------------------------------


def _model_for_try(args: argparse.Namespace, spec: dict[str, Any] | None) -> Any:
    from .config import ModelConfig
    from .errors import ConfigError
    from .job import make_chat_model

    spec = dict(spec or {})
    if args.api_base:
        spec["api_base"] = args.api_base
    if args.model_name:
        spec["model_path"] = args.model_name
    if not spec.get("api_base") and not spec.get("model_path"):
        raise ConfigError("try workflow needs a model: --api-base URL [--model NAME], or 'model' in the input file")
    spec.setdefault("model_path", "default")
    return make_chat_model(ModelConfig(**{k: v for k, v in spec.items() if v is not None}))


def _build(ref: str, role: str, settings: dict[str, Any], registry: Any, built: list[Any]) -> Any:
    """The component for this command, built as for a run (a class is instantiated); closed by the caller."""
    from .components import build_component
    from .config import ComponentSpec

    where = f"reinforge try: {role.replace('_', ' ')} {ref}"  # settings errors name the component
    bound = build_component(ComponentSpec(ref=ref, args=settings), role, registry, where=where)
    built.append(bound)
    return bound


def _where_raised(exc: BaseException) -> str:
    """`` (at file.py:12, in judge)``: the innermost frame outside reinforge and asyncio, for a one-line error."""
    import traceback

    here = os.path.dirname(os.path.abspath(__file__))
    frames = traceback.extract_tb(exc.__traceback__)
    outside = [
        f
        for f in frames
        if not os.path.abspath(f.filename).startswith(here + os.sep)
        and f"{os.sep}asyncio{os.sep}" not in f.filename
        and f"{os.sep}concurrent{os.sep}" not in f.filename
        and not f.filename.endswith(f"{os.sep}threading.py")
    ]
    if not frames:
        return ""
    frame = (outside or frames)[-1]
    return f" (at {frame.filename}:{frame.lineno}, in {frame.name})"


def _call(label: str, coro: Any, timeout: float) -> Any:
    """Run one call of a component; whatever goes wrong is a :class:`ReinforgeError` naming it (no traceback)."""
    from .errors import ComponentError, attributed

    start = time.perf_counter()
    try:
        return asyncio.run(asyncio.wait_for(coro, timeout))
    except ReinforgeError as exc:
        raise attributed(exc, label) from exc
    except (asyncio.TimeoutError, TimeoutError) as exc:
        if time.perf_counter() - start >= timeout:
            raise ComponentError(f"{label} timed out after {timeout:g}s (--timeout)") from None
        raise ComponentError(f"{label} raised {type(exc).__name__}: {exc}{_where_raised(exc)}") from None
    except Exception as exc:
        raise ComponentError(f"{label} raised {type(exc).__name__}: {exc}{_where_raised(exc)}") from None


def _checked(fn: Any, label: str, out: Any, **kwargs: Any) -> Any:
    from .errors import attributed

    try:
        return fn.check_output(out, **kwargs)
    except ReinforgeError as exc:
        raise attributed(exc, label) from exc


def _print_message(msg: dict[str, Any], indent: str = "    ", limit: int = 2000) -> None:
    role = msg.get("role")
    if role == "tool":
        role = f"tool {msg.get('name') or msg.get('tool_call_id') or ''}".rstrip()
    text = str(msg.get("content") or "")
    if len(text) > limit:
        text = text[:limit] + f" ... [{len(text) - limit} more chars]"
    first, *rest = text.splitlines() or [""]
    print(f"{indent}[{role}] {first}")
    for line in rest:
        print(f"{indent}  {line}")
    for tc in msg.get("tool_calls") or []:
        fn = tc.get("function", {})
        print(f"{indent}  -> tool call {fn.get('name')}({fn.get('arguments')})")


def _print_calls(calls: list[Any]) -> None:
    """Each call's new messages only: a multi-turn episode reads as one transcript."""
    shown: list[tuple[Any, Any]] = []
    for i, call in enumerate(calls, 1):
        print(f"  call {i} ({call.seconds:.2f}s, finish {call.response.finish_reason}):")
        keys = [(m.get("role"), m.get("content") or "") for m in call.messages]
        start = len(shown) if shown and keys[: len(shown)] == shown else 0
        if start:
            print(f"    ... {start} earlier message(s), as above")
        for msg in call.messages[start:]:
            _print_message(msg)
        _print_message({**call.response.message, "role": "=> assistant"})
        shown = keys + [("assistant", call.response.content)]


def cmd_try(args: argparse.Namespace) -> int:
    """Run one component on one input; exit 1 when it fails (FAILED, ERROR, raised, timed out, broke the contract)."""
    from .errors import ConfigError
    from .plugins import build_registry, get_plugin_manager
    from .try_inputs import read_try_input

    role = ROLES[args.role]
    try:
        settings = json.loads(args.args)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--args is not valid JSON: {exc}") from None
    if not isinstance(settings, dict):
        raise ConfigError(f"--args must be a JSON object of settings, got {type(settings).__name__}")
    registry = build_registry(get_plugin_manager())
    built: list[Any] = []
    try:
        fn = _build(args.ref, role, settings, registry, built)
        judges = [_build(ref, "judge", {}, registry, built) for ref in args.judge]
        inp = read_try_input(args.input, role)
        for note in inp.notes:
            print(f"note: {note}")
        print(f"task: {json.dumps(inp.task, default=str)[:800]}")
        return _try(args, role, fn, judges, inp)
    finally:
        for bound in reversed(built):
            bound.close()


def _failed(label: str, out: Any) -> int:
    """Exit status 1 and a message when an output is FAILED (transient: in a run it is retried, then discarded)."""
    from .outputs import TaskStatus

    if out.status is TaskStatus.SUCCESS:
        return 0
    print(
        f"error: {label} returned {out.status.name}: {out.error or 'no message'} "
        "(in a run it would be retried, then the sample discarded)",
        file=sys.stderr,
    )
    return 1


def _try(args: argparse.Namespace, role: str, fn: Any, judges: list[Any], inp: Any) -> int:
    from .models import RecordingChatModel
    from .text import response_text
    from .trajectory import Trajectory

    rollout_seconds = inp.rollout_seconds
    score_seconds = 0.0
    code = 0
    if role == "workflow":
        label = f"workflow {fn.name}"
        traj = Trajectory(task=inp.task)
        model = RecordingChatModel(_model_for_try(args, inp.model), traj, inp.sampling)
        start = time.perf_counter()
        out = _checked(fn, label, _call(label, fn.call(inp.task, model), args.timeout))
        rollout_seconds = time.perf_counter() - start
        print(f"{label}: status {out.status.value} in {rollout_seconds:.2f}s, {len(traj.calls)} model call(s)")
        _print_calls(traj.calls)
        print(f"response: {response_text(out.response)}")
        if out.error:
            print(f"error: {out.error}")
        if out.reward is not None:
            print(f"reward (set by the workflow; judges skipped): {out.reward}")
        _print_metrics(out.metrics)
        code = _failed(label, out)
        if code and judges:
            print("judges not called: the workflow failed")
            judges = []
        for judge in judges:
            jlabel = f"judge {judge.name}"
            start = time.perf_counter()
            jout = _checked(judge, jlabel, _call(jlabel, judge.call(inp.task, out.response), args.timeout))
            score_seconds += time.perf_counter() - start
            print(f"{jlabel}: reward {jout.reward} status {jout.status.value}")
            _print_metrics(jout.metrics)
            code = _failed(jlabel, jout) or code
    elif role == "judge":
        label = f"judge {fn.name}"
        start = time.perf_counter()
        out = _checked(fn, label, _call(label, fn.call(inp.task, inp.response), args.timeout))
        score_seconds = time.perf_counter() - start
        print(f"response: {response_text(inp.response)[:1000]}")
        print(f"{label}: reward {out.reward}, status {out.status.value} in {score_seconds:.3f}s")
        if out.error:
            print(f"error: {out.error}")
        _print_metrics(out.metrics)
        code = _failed(label, out)
    else:
        label = f"group reward {fn.name}"
        responses = inp.responses or []
        start = time.perf_counter()
        raw = _call(label, fn.call(inp.task, responses), args.timeout)
        out = _checked(fn, label, raw, group_size=len(responses))
        score_seconds = time.perf_counter() - start
        print(f"{label}: status {out.status.value} in {score_seconds:.3f}s")
        for i, (resp, reward) in enumerate(zip(responses, out.rewards or [None] * len(responses))):
            print(f"  [{i}] reward {reward}  {response_text(resp)[:200]}")
        _print_metrics(out.metrics)
        code = _failed(label, out)
    if rollout_seconds and score_seconds > rollout_seconds / 3:
        print(
            f"warning: scoring took {score_seconds:.2f}s, more than a third of the rollout ({rollout_seconds:.2f}s); "
            "scoring will slow training down",
            file=sys.stderr,
        )
    return code


def _print_metrics(metrics: dict[str, float]) -> None:
    for k, v in sorted(metrics.items()):
        print(f"  {k}: {v}")
