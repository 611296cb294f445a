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
from evq.adapters.ses import config as ses
from evq.adapters.smtp import config as smtp
from evq.adapters.webhooks import config as webhooks
from evq.ops.option_catalogue import CONSTANT_OPTIONS, OPTION_BY_NAME, OPTIONS
from evq.ops.settings import Settings
from evq.worker.config import PACE_OPTIONS, RECONCILE_OPTIONS, RETENTION_OPTIONS, WORKER_OPTIONS, WorkerConfig
from evq.worker.errors import ConfigError


def _defaults(config: type) -> dict[str, object]:
    return {f.name: f.default for f in fields(config)}


def test_every_option_is_one_settings_field_with_its_default():
    # The settings (EVQ_*) and the documented constants: one field each, with its default.
    assert len(OPTION_BY_NAME) == len(OPTIONS) + len(CONSTANT_OPTIONS)
    assert _defaults(Settings) == {o.name: o.default for o in (*OPTIONS, *CONSTANT_OPTIONS)}


@pytest.mark.parametrize(
    ("config", "table", "prefix"),
    [
        (WorkerConfig, (*WORKER_OPTIONS, *PACE_OPTIONS, *RECONCILE_OPTIONS, *RETENTION_OPTIONS), ""),
        (smtp.SmtpConfig, smtp.OPTIONS, "smtp_"),
        (smtp.JournalConfig, smtp.JOURNAL_OPTIONS, "journal_imap_"),
        (http.HttpConfig, http.OPTIONS, "http_"),
        (ses.SesConfig, ses.OPTIONS, "ses_"),
        (webhooks.WebhookConfig, webhooks.OPTIONS, "webhook_"),
    ],
)
def test_each_config_is_its_table(config, table, prefix):
    assert _defaults(config) == {o.name.removeprefix(prefix): o.default for o in table}
    assert all(o.name.startswith(prefix) for o in table)


def test_the_core_config_knows_no_adapter_or_interface_option():
    names = {f.name for f in fields(WorkerConfig)}
    assert not {n for n in names if n.startswith(("smtp_", "http_", "ses_", "serve_", "mcp_", "metrics_", "log_"))}
    assert {o.name for o in null.OPTIONS} == {"null_delay"}


def test_the_configs_are_built_from_the_loaded_settings():
    s = Settings.load(
        env={"EVQ_SMTP_HOST": "mx.example.org", "EVQ_HTTP_TIMEOUT": "4", "EVQ_LEASE_SECONDS": "200"},
        adapter="smtp,http",
        http_api_key="k-1",
    )
    assert s.smtp_config() == smtp.SmtpConfig(host="mx.example.org")
    assert s.http_config() == http.HttpConfig(api_key="k-1", timeout=4.0)
    # The rescuer's interval follows the lease (an eighth of it).
    assert s.worker_config() == WorkerConfig(lease_seconds=200.0, rescue_interval=25.0)


def test_the_ses_settings_are_checked_and_its_secrets_registered():
    s = Settings.load(
        # Region and credentials are the AWS chain's (docs/settings.md): a Python caller may pass them.
        env={"EVQ_SES_CONFIGURATION_SET": "evq-events", "EVQ_HTTP_TIMEOUT": "5"},
        adapter="ses",
        ses_region="eu-west-1",
        ses_access_key_id="AKIAEXAMPLE0000",
        ses_secret_access_key="the-secret-access-key",
    )
    assert s.ses_config() == ses.SesConfig(
        region="eu-west-1",
        configuration_set="evq-events",
        timeout=5.0,
        access_key_id="AKIAEXAMPLE0000",
        secret_access_key="the-secret-access-key",
    )
    assert {"AKIAEXAMPLE0000", "the-secret-access-key"} <= set(s.secrets())
    assert s.as_public_dict()["ses_secret_access_key"] == "***"
    refusals = [
        ({"ses_access_key_id": "AKIAEXAMPLE0000"}, "EVQ_SES_ACCESS_KEY_ID"),  # without its secret
        ({"ses_endpoint_url": "ftp://ses.example"}, "EVQ_SES_ENDPOINT_URL"),
        ({"ses_timeout": 60.0}, "EVQ_LEASE_SECONDS"),  # 3 x 60 s is more than the lease
    ]
    for given, named in refusals:
        with pytest.raises(ConfigError) as refused:
            Settings.load(env={"EVQ_ADAPTER": "ses"}, **given)
        assert named in refused.value.message
    # The SES timeout follows EVQ_HTTP_TIMEOUT, so the lease check sees it there too.
    with pytest.raises(ConfigError, match="EVQ_LEASE_SECONDS"):
        Settings.load(env={"EVQ_ADAPTER": "ses", "EVQ_HTTP_TIMEOUT": "60"})
    # Only a worker that sends through SES checks them; no variable sets them any more.
    assert Settings.load(env={}, ses_access_key_id="AKIAEXAMPLE0000").adapter == ("smtp",)
    assert Settings.load(env={"EVQ_SES_ACCESS_KEY_ID": "AKIAEXAMPLE0000"}).ses_access_key_id is None


def test_a_journal_address_is_refused_with_a_relay():
    # Through a relay the journal copy carries the step's evq_key; its events would be the step's.
    env = {"EVQ_SMTP_JOURNAL": "journal@example.org", "EVQ_SMTP_RELAY": "sendgrid"}
    with pytest.raises(ConfigError) as refused:
        Settings.load(env=env)
    assert "EVQ_SMTP_JOURNAL" in refused.value.message and "EVQ_SMTP_RELAY" in refused.value.message
    # Each alone is fine, and a worker that does not send through SMTP does not check them.
    assert Settings.load(env={"EVQ_SMTP_JOURNAL": "journal@example.org"}).smtp_journal == "journal@example.org"
    assert Settings.load(env={"EVQ_SMTP_RELAY": "sendgrid"}).smtp_relay == "sendgrid"
    assert Settings.load(env={**env, "EVQ_ADAPTER": "null"}).adapter == ("null",)


def test_keep_content_is_a_duration_zero_or_forever():
    assert Settings.load(env={}).worker_config().keep_content == 30 * 86400.0
    assert Settings.load(env={"EVQ_KEEP_CONTENT": "forever"}).worker_config().keep_content is None
    assert Settings.load(env={"EVQ_KEEP_CONTENT": "0"}).keep_content == 0.0
    assert Settings.load(env={}, keep_content="12h").keep_content == 43200.0
    for bad in ("-1d", "soon", "nan"):
        with pytest.raises(ConfigError) as refused:
            Settings.load(env={"EVQ_KEEP_CONTENT": bad})
        assert "EVQ_KEEP_CONTENT" in refused.value.message


def test_an_evidence_partition_size_is_bounded_as_the_database_bounds_it():
    """The migration refuses a partition of more than a billion step ids: one covering every
    future step would never be dropped. The setting says so before a worker starts."""
    assert Settings.load(env={"EVQ_EVIDENCE_PARTITION_STEPS": "1000000000"}).evidence_partition_steps == 10**9
    for value, said in (("1000000001", "at most 1000000000"), ("999", "at least 1000")):
        with pytest.raises(ConfigError) as refused:
            Settings.load(env={"EVQ_EVIDENCE_PARTITION_STEPS": value})
        assert (
            refused.value.message
            == f"EVQ_EVIDENCE_PARTITION_STEPS (--evidence-partition-steps) must be {said}, got {value}"
        )


def test_a_journal_address_leaves_room_for_each_steps_tag():
    # Each copy goes to local+<32 hex>@domain: the local part stays within RFC 5321's 64.
    assert Settings.load(env={"EVQ_SMTP_JOURNAL": f"{'j' * 31}@example.org"}).smtp_journal
    with pytest.raises(ConfigError, match="EVQ_SMTP_JOURNAL") as refused:
        Settings.load(env={"EVQ_SMTP_JOURNAL": f"{'j' * 32}@example.org"})
    assert "at most 31 characters" in refused.value.message
