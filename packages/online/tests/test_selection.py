"""Selection strategies: sticky sampling, explicit marking, plugin strategies through the hook; the entry point."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from online_testlib import HTTP, SECRET, TRAFFIC_KEY, UPSTREAM_BODY

import reinforge_online.plugin as ours
from reinforge.plugin import ConfigError, Settings, get_plugin_manager, hookimpl, load_settings
from reinforge.testing import check_entry_point
from reinforge_online import ExplicitMarking, SamplingRate, SelectionRequest, build_selection
from reinforge_online.config import SelectionSettings
from reinforge_online.selection import selection_registry, selection_secret, session_of


def req(headers: dict[str, str] | None = None, body: dict[str, Any] | None = None) -> SelectionRequest:
    headers, body = headers or {}, body or {}
    return SelectionRequest("/v1/chat/completions", headers, body, session_of(headers, body))


def test_sampling_rate_is_sticky_per_session_and_p_0_and_1_are_exact():
    rate = SamplingRate(0.3, salt="s")
    decisions = {f"session-{i}": rate.decide(f"session-{i}") for i in range(2000)}
    assert all(SamplingRate(0.3, salt="s").decide(s) == d for s, d in decisions.items())  # same on any replica
    assert 0.25 < sum(decisions.values()) / len(decisions) < 0.35
    assert decisions != {s: SamplingRate(0.3, salt="other").decide(s) for s in decisions}  # the salt matters
    assert not any(SamplingRate(0.0).decide(s) for s in decisions)
    assert all(SamplingRate(1.0).decide(s) for s in decisions)
    assert SamplingRate(1.0).select(req()) and not SamplingRate(0.0).select(req())
    with pytest.raises(ValueError, match="p must be in"):
        SamplingRate(1.5)


def test_the_session_is_the_header_else_the_user_field():
    assert session_of({"x-session-id": "h"}, {"user": "u"}) == "h"
    assert session_of({}, {"user": "u"}) == "u"
    assert session_of({}, {"user": 5}) is None
    rate = SamplingRate(0.5, salt="x")
    users = [f"u{i}" for i in range(50)]
    assert [rate.select(req(body={"user": u})) for u in users] == [rate.decide(u) for u in users]


def test_explicit_marking():
    mark = ExplicitMarking()
    assert mark.select(req({"x-reinforge-sample": "1"})) and not mark.select(req({"x-reinforge-sample": "0"}))
    assert not mark.select(req())
    assert ExplicitMarking(otherwise=SamplingRate(1.0)).select(req())
    assert not ExplicitMarking(otherwise=SamplingRate(1.0)).select(req({"x-reinforge-sample": "0"}))
    built = build_selection(SelectionSettings(strategy="explicit"))
    assert isinstance(built, ExplicitMarking) and built.otherwise is None


@dataclass
class TenantSettings(Settings):
    tenants: list[str]


class Tenant:
    def __init__(self, settings: TenantSettings) -> None:
        self.tenants = set(settings.tenants)

    def select(self, request: SelectionRequest) -> bool:
        return request.headers.get("x-tenant") in self.tenants


class EveryOther:
    def __init__(self, start: int = 0) -> None:
        self.n = start

    def select(self, request: SelectionRequest) -> bool:
        self.n += 1
        return self.n % 2 == 0


class StrategiesPlugin:
    @hookimpl
    def register_selection_strategies(self, register):
        register("tenant", Tenant, settings=TenantSettings, description="by tenant header")
        register("every_other", EveryOther)


class OtherTenantPlugin:
    @hookimpl
    def register_selection_strategies(self, register):
        register("tenant", EveryOther)


def with_plugins(*plugins):
    pm = get_plugin_manager(load_entrypoints=False)
    pm.register(ours, name="reinforge-online")
    for plugin in plugins:
        pm.register(plugin, name=f"reinforge-{type(plugin).__name__.lower()}")
    return pm


def test_plugin_strategies_come_through_the_hook():
    pm = with_plugins(StrategiesPlugin())
    assert pm.hook.register_selection_strategies.has_spec() and pm.broken == []
    tenant = build_selection(SelectionSettings(strategy="tenant", args={"tenants": ["a"]}), pm=pm)
    assert tenant.select(req({"x-tenant": "a"})) and not tenant.select(req({"x-tenant": "b"}))
    other = build_selection(SelectionSettings(strategy="every_other", args={"start": 1}), pm=pm)
    assert [other.select(req()) for _ in range(3)] == [True, False, True]
    with pytest.raises(ConfigError, match=r"online.yaml: selection.args.tenants: expected a list"):
        build_selection(SelectionSettings(strategy="tenant", args={"tenants": "a"}), pm=pm)
    with pytest.raises(ConfigError, match=r"selection.strategy: unknown strategy 'tenat'.*tenant"):
        build_selection(SelectionSettings(strategy="tenat"), pm=pm)
    with pytest.raises(ConfigError, match="takes no args"):
        build_selection(SelectionSettings(args={"x": 1}), pm=pm)


def test_two_plugins_claiming_one_name_is_an_error_naming_both():
    pm = with_plugins(StrategiesPlugin(), OtherTenantPlugin())
    assert selection_registry(pm).conflicts
    with pytest.raises(Exception, match="registered twice") as info:
        build_selection(SelectionSettings(strategy="tenant", args={"tenants": []}), pm=pm)
    assert "reinforge-strategiesplugin" in str(info.value) and "reinforge-othertenantplugin" in str(info.value)


def test_the_entry_point_loads_and_adds_the_command(capsys):
    check_entry_point("reinforge-online")
    from reinforge.testing import cli_main

    with pytest.raises(SystemExit) as info:
        cli_main(["online", "serve", "--help"])
    assert info.value.code == 0
    assert "ONLINE.yaml" in capsys.readouterr().out


def test_serve_command_builds_the_gateway_from_a_file(tmp_path, monkeypatch):
    import argparse

    from reinforge_online.cli import add_arguments, build

    (tmp_path / "online.yaml").write_text(
        'upstream: {url: "http://127.0.0.1:9/v1"}\npolicy: {url: "http://127.0.0.1:8/v1"}\nlisten: {port: 8123}\n'
    )
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(ConfigError, match="auth.traffic_key_env: is required unless dev"):
        build(parser.parse_args([str(tmp_path / "online.yaml")]))
    app, host, port = build(parser.parse_args([str(tmp_path / "online.yaml"), "--dev", "--port", "0"]))
    try:
        assert (host, port) == ("127.0.0.1", 0)
        assert app.state.gateway.secrets.traffic_key is None
        assert app.state.gateway.store.path == str(tmp_path / "traces.sqlite")
    finally:
        app.state.gateway.store.close()


def test_a_raising_strategy_leaves_requests_unsampled(gateway, tmp_path, upstream, policy):
    from online_testlib import SECRETS, settings

    from reinforge.testing import BackgroundServer
    from reinforge_online.app import build_app

    class Broken:
        def select(self, request: SelectionRequest) -> bool:
            raise RuntimeError("boom")

    s = settings(upstream[1].v1, policy[1].v1, tmp_path / "b.sqlite")
    with BackgroundServer(build_app(s, SECRETS, selection=Broken())) as server:
        r = HTTP.post(
            f"{server.v1}/chat/completions",
            content=json.dumps({"model": "m", "messages": []}),
            headers={"authorization": f"Bearer {TRAFFIC_KEY}"},
        )
        assert r.status_code == 200 and r.content == UPSTREAM_BODY


def test_sticky_through_the_gateway(gateway):
    server = gateway(selection={"sampling_rate": 0.5, "salt": "k"})
    rate = SamplingRate(0.5, salt="k", secret=selection_secret(SECRET))  # the gateway's secret, not the file's salt
    with httpx.Client(headers={"authorization": f"Bearer {TRAFFIC_KEY}"}, verify=False) as client:
        for i in range(12):
            session = f"conv-{i}"
            got = [
                "x-reinforge-trace-id"
                in client.post(
                    f"{server.v1}/chat/completions",
                    json={"model": "m", "messages": [{"role": "user", "content": str(turn)}]},
                    headers={"x-session-id": session},
                ).headers
                for turn in range(2)
            ]
            assert got == [rate.decide(session)] * 2  # whole conversations in or out


def test_settings_reject_bad_selection():
    with pytest.raises(ConfigError, match="selection.strategy: must not be empty"):
        load_settings(SelectionSettings, {"strategy": " "}, where="online.yaml", prefix="selection")
