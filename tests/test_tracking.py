"""W&B tracking: off without a wandb logger or with WANDB_MODE=disabled; offline runs land under
WANDB_DIR with the right names, metrics and lineage; never the network, never a secret."""

import json
import struct
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from elmolab.core import tracking
from elmolab.core.params import compose_params
from elmolab.core.tracking import TrackedRun, init_run, metric_key, redact, run_tags

ROOT = Path(__file__).resolve().parents[1]

SECRET = "sk-not-a-real-key-42"


def cfg(wandb: bool = True, mode: str = "offline"):
    """A composed config (conf/logger/*.yaml's keys); a secret planted to test redaction."""
    return OmegaConf.create(
        {
            "study": "elmolab-test",
            "seed": 1,
            "logger": {"wandb": wandb, "wandb_mode": mode},
            "somewhere": {"api_key": SECRET},
        }
    )


@pytest.fixture
def no_network(monkeypatch, tmp_path):
    """No API key anywhere, and any attempt to reach the network fails the test."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")

    def refuse(*args, **kwargs):
        raise AssertionError("tried to reach the network")

    monkeypatch.setattr(tracking, "network_available", refuse)


def finished_run_records(run_dir: Path, timeout: float = 60.0) -> list:
    """The records of an offline run once its exit record is written: ``finish()`` returns
    before W&B's service process has flushed the file."""
    deadline = time.monotonic() + timeout
    while True:
        records = wandb_records(run_dir)
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            return records
        assert time.monotonic() < deadline, f"no exit record in {run_dir} after {timeout} s"
        time.sleep(0.2)


def wandb_records(run_dir: Path) -> list:
    """The protobuf records of an offline run's ``run-<id>.wandb`` (LevelDB-style log: a 7-byte
    file header, then records with a 7-byte header: crc32, length, type; 32 KiB blocks)."""
    from wandb.proto import wandb_internal_pb2

    data = next(run_dir.glob("run-*.wandb")).read_bytes()
    block, position, pending, records = 32768, 7, b"", []
    while position + 7 <= len(data):
        if block - position % block < 7:  # the rest of a block is padding
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        piece = data[position + 7 : position + 7 + length]
        if len(piece) < length:  # a record still being written
            break
        pending += piece
        position += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def history(records) -> dict:
    return {
        "/".join(item.nested_key) or item.key: json.loads(item.value_json)
        for record in records
        if record.WhichOneof("record_type") == "history"
        for item in record.history.item
    }


def test_without_a_wandb_logger_the_run_is_a_no_op(no_network, tmp_path):
    with init_run(cfg(wandb=False), job_type="probe") as run:
        assert not run.enabled
        run.log({"test/accuracy": 0.9})
        run.log_mix_weights([0.2, 0.5, 0.3], gamma=1.0)
        run.add_input("bilm", "model", tmp_path)
        run.add_output("probe", "probe", tmp_path)
    assert not (tmp_path / "wandb").exists()


def test_wandb_mode_disabled_turns_it_off(no_network, monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    with init_run(cfg(), job_type="probe") as run:
        assert run.run is None
    assert not (tmp_path / "wandb").exists()


def test_online_needs_a_key_and_the_network_else_offline(no_network, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert tracking.wandb_mode(cfg(mode="offline")) == "offline"
    assert tracking.wandb_mode(cfg(mode="online")) == "offline"  # no key: no network attempt
    monkeypatch.setenv("WANDB_API_KEY", SECRET)
    monkeypatch.setattr(tracking, "network_available", lambda: True)
    assert tracking.wandb_mode(cfg(mode="online")) == "online"
    assert tracking.wandb_mode(cfg(mode="offline")) == "offline"
    monkeypatch.setenv("WANDB_MODE", "offline")  # the environment overrides the config
    assert tracking.wandb_mode(cfg(mode="online")) == "offline"
    monkeypatch.setattr(tracking, "network_available", lambda: False)
    monkeypatch.setenv("WANDB_MODE", "online")
    assert tracking.wandb_mode(cfg(mode="offline")) == "offline"
    assert tracking.wandb_mode(cfg(wandb=False)) is None


def test_offline_run_records_names_metrics_mix_weights_and_lineage(
    no_network, monkeypatch, tmp_path
):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("DVC_STAGE", "probe@upos-layer1")
    monkeypatch.setenv("DVC_EXP_NAME", "exp-tidy-owl")
    model = tmp_path / "bilm"
    model.mkdir()
    (model / "options.json").write_text("{}", encoding="utf-8")
    fields = {"task": "upos", "features": "scalar_mix", "encoder": "trained", "seed": 1}
    with init_run(cfg(), job_type="probe", tags=run_tags(**fields), config=fields) as run:
        assert run.enabled
        run.log({metric_key("val", "accuracy"): 0.91}, step=1)
        run.log({metric_key("test", "accuracy"): 0.9}, step=2)
        run.log_mix_weights([0.2, 0.5, 0.3], gamma=1.25, step=2)
        run.add_input("bilm", "model", model)
        run.add_output("probe-upos", "probe", model / "options.json")
    [run_dir] = (tmp_path / "wandb").glob("offline-run-*")
    records = finished_run_records(run_dir)
    [start] = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert start.display_name == "probe@upos-layer1" and start.run_group == "exp-tidy-owl"
    assert start.job_type == "probe" and start.project == "elmolab-test"
    assert list(start.tags) == ["task:upos", "features:scalar_mix", "encoder:trained", "seed:1"]
    config = {
        item.key: json.loads(item.value_json)
        for r in records
        if r.WhichOneof("record_type") in ("run", "config")
        for item in (r.run.config if r.WhichOneof("record_type") == "run" else r.config).update
    }
    assert config["task"] == "upos" and config["params"]["somewhere"]["api_key"] == "<redacted>"
    assert config["inputs/bilm"] == {"type": "model", "uri": model.resolve().as_uri()}
    logged = history(records)
    assert logged["test/accuracy"] == 0.9
    assert logged["mix/w1"] == 0.5 and logged["mix/gamma"] == 1.25
    assert any(r.WhichOneof("record_type") == "artifact" for r in records)
    for path in (tmp_path / "wandb").rglob("*"):
        assert not path.is_file() or SECRET.encode() not in path.read_bytes(), path


def test_the_run_is_finished_with_exit_code_1_when_the_stage_fails(
    no_network, monkeypatch, tmp_path
):
    monkeypatch.setenv("WANDB_MODE", "offline")
    with pytest.raises(RuntimeError, match="probe diverged"), init_run(cfg(), "probe") as run:
        run.log({"train/loss": 1.0})
        raise RuntimeError("probe diverged")
    [run_dir] = (tmp_path / "wandb").glob("offline-run-*")
    exits = [r.exit for r in finished_run_records(run_dir) if r.WhichOneof("record_type") == "exit"]
    assert [e.exit_code for e in exits] == [1]


def test_sync_says_what_to_do_without_a_key_or_network(no_network, monkeypatch, tmp_path, capsys):
    def no_subprocess(*args, **kwargs):
        raise AssertionError("wandb sync must not run")

    monkeypatch.setattr(subprocess, "run", no_subprocess)
    assert tracking.sync(tmp_path) == 0
    assert "nothing to sync" in capsys.readouterr().out
    run_dir = tmp_path / "wandb" / "offline-run-20250101_000000-abc"
    run_dir.mkdir(parents=True)
    assert tracking.sync(tmp_path) == 0
    assert "export WANDB_API_KEY" in capsys.readouterr().out
    monkeypatch.setenv("WANDB_API_KEY", SECRET)
    monkeypatch.setattr(tracking, "network_available", lambda: False)
    assert tracking.sync(tmp_path) == 0
    out = capsys.readouterr().out
    assert "does not answer" in out and SECRET not in out


def test_sync_uploads_unsynced_runs_when_it_can(no_network, monkeypatch, tmp_path):
    for name in ("offline-run-1-a", "offline-run-2-b"):
        (tmp_path / "wandb" / name).mkdir(parents=True)
    (tmp_path / "wandb" / "offline-run-2-b" / "run-b.wandb.synced").touch()
    monkeypatch.setenv("WANDB_API_KEY", SECRET)
    monkeypatch.setattr(tracking, "network_available", lambda: True)
    calls = []
    monkeypatch.setattr(
        subprocess,
        "run",
        lambda command, check: calls.append(command) or subprocess.CompletedProcess(command, 0),
    )
    assert tracking.main(["sync", "--root", str(tmp_path)]) == 0
    [command] = calls
    assert command[1:4] == ["-m", "wandb", "sync"]
    assert command[4:] == [str(tmp_path / "wandb" / "offline-run-1-a")]


def test_redact_hides_secret_keys_at_any_depth():
    config = {"a": 1, "logger": {"wandb": {"api_key": "x", "project": "p"}}, "l": [{"token": "y"}]}
    assert redact(config) == {
        "a": 1,
        "logger": {"wandb": {"api_key": "<redacted>", "project": "p"}},
        "l": [{"token": "<redacted>"}],
    }


@pytest.mark.parametrize(
    "key", ["api_key", "WANDB_API_KEY", "Token", "hf-token", "access_token", "password", "secret"]
)
def test_a_secret_key_is_matched_whole_in_any_case(key):
    assert redact({key: "s", "batch_tokens": 8}) == {key: "<redacted>", "batch_tokens": 8}


def test_the_run_config_keeps_every_setting_of_the_default_config():
    """Only secrets are redacted: max_sentence_tokens, token_column, token_encoder, batch_tokens
    and every other key of the default composition reach W&B as they are."""
    config = OmegaConf.create(yaml.safe_load(compose_params(ROOT / "conf")))
    params = OmegaConf.to_container(config, resolve=True)
    config.logger.wandb_api_key = SECRET
    assert tracking.run_config(config, {"task": "upos"}) == {
        "task": "upos",
        "params": {**params, "logger": {**params["logger"], "wandb_api_key": "<redacted>"}},
    }


def test_metric_keys_and_tags():
    assert metric_key("val", "ppl") == "val/ppl"
    with pytest.raises(ValueError, match="split must be"):
        metric_key("dev", "accuracy")
    assert run_tags(task="upos", seed=None, features="layer1") == ["task:upos", "features:layer1"]
    assert not TrackedRun().enabled
