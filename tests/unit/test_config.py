"""The one loader (ops/settings.py) and the configs it builds agree on every option.

Each config declares its own table beside the code that reads it; the loader's flat
Settings has one field per option. These tests keep the copies from drifting: a field
without an option (or the other way round), or a default that differs, fails here.
"""

from __future__ import annotations

from dataclasses import fields

import pytest

from evq.adapters import null
from evq.adapters.http import config as http
from evq.adapters.smtp import config as smtp
from evq.adapters.webhooks import config as webhooks
from evq.ops.settings import OPTION_BY_NAME, OPTIONS, Settings
from evq.worker.config import PACE_OPTIONS, RECONCILE_OPTIONS, RETENTION_OPTIONS, WORKER_OPTIONS, WorkerConfig
from evq.worker.errors import ConfigError


def _defaults(config: type) -> dict[str, object]:
    return {f.name: f.default for f in fields(config)}


def test_every_option_is_one_settings_field_with_its_default():
    assert len(OPTION_BY_NAME) == len(OPTIONS)
    assert _defaults(Settings) == {o.name: o.default for o in OPTIONS}


@pytest.mark.parametrize(
    ("config", "table", "prefix"),
    [
        (WorkerConfig, (*WORKER_OPTIONS, *PACE_OPTIONS, *RECONCILE_OPTIONS, *RETENTION_OPTIONS), ""),
        (smtp.SmtpConfig, smtp.OPTIONS, "smtp_"),
        (http.HttpConfig, http.OPTIONS, "http_"),
        (webhooks.WebhookConfig, webhooks.OPTIONS, "webhook_"),
    ],
)
def test_each_config_is_its_table(config, table, prefix):
    assert _defaults(config) == {o.name.removeprefix(prefix): o.default for o in table}
    assert all(o.name.startswith(prefix) for o in table)


def test_the_core_config_knows_no_adapter_or_interface_option():
    names = {f.name for f in fields(WorkerConfig)}
    assert not {n for n in names if n.startswith(("smtp_", "http_", "serve_", "mcp_", "metrics_", "log_"))}
    assert {o.name for o in null.OPTIONS} == {"null_delay"}


def test_the_configs_are_built_from_the_loaded_settings():
    s = Settings.load(
        env={"EVQ_SMTP_HOST": "mx.example.org", "EVQ_HTTP_TIMEOUT": "4", "EVQ_LEASE_SECONDS": "200"},
        adapter="smtp,http",
        http_api_key="k-1",
    )
    assert s.smtp_config() == smtp.SmtpConfig(host="mx.example.org")
    assert s.http_config() == http.HttpConfig(api_key="k-1", timeout=4.0)
    assert s.worker_config() == WorkerConfig(lease_seconds=200.0)


def test_keep_content_is_a_duration_zero_or_forever():
    assert Settings.load(env={}).worker_config().keep_content == 30 * 86400.0
    assert Settings.load(env={"EVQ_KEEP_CONTENT": "forever"}).worker_config().keep_content is None
    assert Settings.load(env={"EVQ_KEEP_CONTENT": "0"}).keep_content == 0.0
    assert Settings.load(env={}, keep_content="12h").keep_content == 43200.0
    for bad in ("-1d", "soon", "nan"):
        with pytest.raises(ConfigError) as refused:
            Settings.load(env={"EVQ_KEEP_CONTENT": bad})
        assert "EVQ_KEEP_CONTENT" in refused.value.message
