"""ensure_tiny_checkpoint: content-keyed cache, atomic and race-safe; deterministic builds."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import service.checkpoint as ckpt

REPO_ROOT = Path(__file__).resolve().parents[2]


def _fake_builder(calls: list[Path], delay: float = 0.2):
    def fake_build(out_dir: Path, log=None):
        import time

        calls.append(out_dir)
        out_dir.mkdir(parents=True)
        time.sleep(delay)  # long enough for a racing caller to arrive
        (out_dir / "config.json").write_text("{}")
        return {"fake": True}

    return fake_build


def test_cache_folder_is_named_by_the_content_key(tmp_path, monkeypatch):
    calls: list[Path] = []
    monkeypatch.setattr(ckpt, "build_checkpoint", _fake_builder(calls, delay=0))
    path = ckpt.ensure_tiny_checkpoint(tmp_path)
    assert path == tmp_path / f"{ckpt.TINY_CHECKPOINT_NAME}-{ckpt.checkpoint_key()[:16]}"
    assert (path / "config.json").is_file() and (path / ".complete").is_file()
    assert ckpt.ensure_tiny_checkpoint(tmp_path) == path
    assert len(calls) == 1  # the second call used the cache
    leftovers = [p.name for p in tmp_path.iterdir() if p.is_dir() and p != path]
    assert leftovers == []  # no temporary build folder left behind


def test_concurrent_callers_build_once(tmp_path, monkeypatch):
    calls: list[Path] = []
    monkeypatch.setattr(ckpt, "build_checkpoint", _fake_builder(calls))
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(ckpt.ensure_tiny_checkpoint(tmp_path))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert len(set(results)) == 1 and len(results) == 3


def test_a_failed_build_leaves_nothing_behind(tmp_path, monkeypatch):
    def broken(out_dir: Path, log=None):
        out_dir.mkdir(parents=True)
        (out_dir / "half.json").write_text("{")
        raise RuntimeError("boom")

    monkeypatch.setattr(ckpt, "build_checkpoint", broken)
    with pytest.raises(RuntimeError, match="boom"):
        ckpt.ensure_tiny_checkpoint(tmp_path)
    assert [p for p in tmp_path.iterdir() if p.is_dir()] == []


def test_default_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(ckpt.CACHE_DIR_ENV, str(tmp_path / "c"))
    assert ckpt.default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv(ckpt.CACHE_DIR_ENV)
    assert ckpt.default_cache_dir() == Path.home() / ".cache" / "moss-gateway"


def test_key_changes_with_the_sources(monkeypatch):
    key = ckpt.checkpoint_key()
    assert len(key) == 64 and key == ckpt.checkpoint_key()
    monkeypatch.setattr(ckpt, "_SOURCE_FILES", ckpt._SOURCE_FILES[:-1])
    assert ckpt.checkpoint_key() != key


def _digest(folder: Path) -> dict[str, str]:
    skip = {"tiny_checkpoint_build.json", ".complete"}  # timings differ between runs
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name not in skip
    }


def test_a_fresh_build_is_byte_identical_to_the_cached_one(tmp_path, tiny_checkpoint):
    """Another process builds again: every file but the timing report is identical.
    (The cache key includes the CPU model, so both builds ran on this CPU type.)"""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "service.checkpoint", "build", "--out", str(tmp_path / "fresh")],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        timeout=300,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr).decode(errors="replace")[-3000:]
    fresh, cached = _digest(tmp_path / "fresh"), _digest(tiny_checkpoint)
    assert "model.safetensors" in fresh and "tokenizer.json" in fresh
    assert fresh == cached
