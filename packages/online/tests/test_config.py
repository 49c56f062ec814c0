"""online.yaml through core's settings checker: every problem names the file and the key."""

from __future__ import annotations

import pytest

from reinforge.plugin import ConfigError
from reinforge_online.config import load_config, resolve_secrets

GOOD = """
upstream: {url: "http://127.0.0.1:9/v1", key_env: UP_KEY}
policy: {url: "http://127.0.0.1:8/v1"}
auth: {traffic_key_env: T_KEY, admin_key_env: A_KEY, feedback_secret_env: F_KEY}
selection: {sampling_rate: 0.25, salt: s}
store: {path: traces.sqlite}
"""


def write(tmp_path, text):
    path = tmp_path / "online.yaml"
    path.write_text(text)
    return path


def test_good_config_and_its_defaults(tmp_path):
    s = load_config(write(tmp_path, GOOD))
    assert s.listen.host == "127.0.0.1" and s.listen.port == 8100
    assert s.mode_of("/v1/chat/completions") == "route"
    assert s.store.path == str(tmp_path / "traces.sqlite")  # relative to the file
    assert s.limits.max_body_bytes == 4 * 2**20
    assert s.feedback.conflict == "first-wins"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (GOOD.replace("0.25", "1.5"), r"online.yaml: selection.sampling_rate: .*1.5"),
        (GOOD.replace("0.25", '"x"'), r"selection.sampling_rate: expected a number"),
        (GOOD.replace('policy: {url: "http://127.0.0.1:8/v1"}', "mode: shadow"), r"policy: shadow mode needs policy"),
        (GOOD + "reward: {judges: []}\n", r"reward.judges: name at least one judge"),
        (GOOD + "reward: {run: r.yaml, judges: [exact_match]}\n", r"reward.judges: set either run"),
        (GOOD + "reward: {run: missing.yaml}\n", r"reward.run: 'missing.yaml' does not exist"),
        (GOOD + "reward: {judges: [exact_match], timeout_s: 0}\n", r"reward.timeout_s"),
        (
            GOOD + "reward: {judges: [exact_match], reward_min: 1, reward_max: 0}\n",
            r"reward.reward_max: must be at least",
        ),
        (GOOD + "reward: {judges: [exact_match], reward_max: .nan}\n", r"reward.reward_max: must be a finite"),
        (GOOD + "reward: {judges: [exact_match], timeout: 3}\n", r"unknown key 'reward.timeout'.*timeout_s"),
        (GOOD + "shadow: {tools: {search: not_a_ref}}\n", r"shadow.tools.search: expected a module:function"),
        (GOOD + "shadow: {queue_size: 0}\n", r"shadow.queue_size"),
        (GOOD + "mode: fast\n", r"mode: .*fast"),
        (GOOD + "routes: {/v1/other: route}\n", r"routes./v1/other: not a route with a mode"),
        (GOOD + "limits: {max_body_byte: 3}\n", r"unknown key 'limits.max_body_byte'.*max_body_bytes"),
        (GOOD.replace("http://127.0.0.1:9/v1", "127.0.0.1:9"), r"upstream.url: expected an http"),
        (GOOD.replace("admin_key_env: A_KEY", "admin_key_env: T_KEY"), r"auth.admin_key_env: must name another"),
        (GOOD.replace("traffic_key_env: T_KEY, ", ""), r"auth.traffic_key_env: is required unless dev"),
        (GOOD.replace('policy: {url: "http://127.0.0.1:8/v1"}', ""), r"policy: route mode needs policy.url"),
        (GOOD + "listen: {port: 70000}\n", r"listen.port"),
        (
            GOOD.replace("store: {path: traces.sqlite}", "store: {url: 'postgresql://u:pw@127.0.0.1/db'}"),
            r"store.url: must not hold a password: name its environment variable in store.password_env",
        ),
        (
            GOOD.replace("store: {path: traces.sqlite}", "store: {url: 'mysql://u@h/db'}"),
            r"store.url: expected a postgr",
        ),
        (GOOD.replace("store: {path: traces.sqlite}", "store: {password_env: PW}"), r"store.password_env: is only for"),
        ("upstream: [1]\n", r"upstream"),
        ("{", r"not valid YAML"),
    ],
)
def test_bad_configs_name_the_file_and_key(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message) as info:
        load_config(write(tmp_path, text))
    assert "online.yaml" in str(info.value)


def test_store_url_selects_postgres_and_names_the_password_variable(tmp_path):
    text = GOOD.replace(
        "store: {path: traces.sqlite}", "store: {url: 'postgresql://u@127.0.0.1:5/db', password_env: PW}"
    )
    s = load_config(write(tmp_path, text))
    assert (s.store.url, s.store.password_env) == ("postgresql://u@127.0.0.1:5/db", "PW")
    assert load_config(write(tmp_path, GOOD)).store.url is None  # SQLite unless a URL is given


def test_dev_allows_anonymous_and_record_needs_no_policy(tmp_path):
    s = load_config(write(tmp_path, 'upstream: {url: "http://127.0.0.1:9/v1"}\ndev: true\nmode: record\n'))
    secrets = resolve_secrets(s)
    assert secrets.traffic_key is None and secrets.admin_key is None
    assert len(secrets.feedback_secret) == 32  # random per process


def test_secrets_come_from_the_environment(tmp_path, monkeypatch):
    s = load_config(write(tmp_path, GOOD))
    with pytest.raises(ConfigError, match="auth.traffic_key_env: the environment variable T_KEY is not set"):
        resolve_secrets(s)
    for name, value in {"T_KEY": "t", "A_KEY": "a", "F_KEY": "f", "UP_KEY": "u"}.items():
        monkeypatch.setenv(name, value)
    got = resolve_secrets(s)
    assert (got.traffic_key, got.admin_key, got.feedback_secret, got.upstream_key) == ("t", "a", b"f", "u")
    monkeypatch.setenv("A_KEY", "t")
    with pytest.raises(ConfigError, match="the admin key must differ"):
        resolve_secrets(s)


def test_a_postgres_store_without_psycopg_names_the_extra(monkeypatch):
    import sys

    from reinforge_online.pgstore import PostgresTraceStore

    monkeypatch.setitem(sys.modules, "psycopg", None)  # as if the [postgres] extra were not installed
    with pytest.raises(ConfigError, match=r"store.url: .*pip install 'reinforge-online\[postgres\]'"):
        PostgresTraceStore("postgresql://u@127.0.0.1:1/db")
