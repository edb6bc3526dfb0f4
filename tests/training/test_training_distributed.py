"""Several processes on CPU (gloo): the VLM and the encoder train under DDP through the local launcher (torchrun),
the encoder under FSDP2, and the all-gather of negatives keeps the gradient on each process's own rows."""

from __future__ import annotations

import json
import math
import os
import socket

import pytest
import torch
import yaml
from test_training_data import build_training_snapshot

from schemas.config import PROJECT_ROOT

pytestmark = pytest.mark.slow  # each run starts two Python processes that import torch and transformers


@pytest.fixture(scope="module")
def snap(tmp_path_factory):
    return build_training_snapshot(tmp_path_factory.mktemp("ddp") / "root")


def _job(tmp_path, kind: str, name: str, **optim) -> str:
    d = yaml.safe_load((PROJECT_ROOT / "config" / "training" / f"{kind}-tiny-cpu.yaml").read_text())
    d["name"] = name
    d["optim"].update({"checkpoint_every": 100, "batch_size": 4, **optim})
    d["launch"] = {"launcher": "local", "nproc_per_node": 2, "timeout_s": 600}
    if kind == "vlm":
        d["data"]["max_eval_items"] = 4
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(d))
    return str(path)


def _launch(snap, cfg: str, kind: str, out) -> dict:
    from training.config import load_job_config
    from training.launchers import LaunchRequest, launch_local

    job = load_job_config(cfg)
    req = LaunchRequest(
        job=kind,
        name=job.name,
        snapshot_version="0.1.0",
        content_hash="x",
        job_config=cfg,
        root=snap.root,
        output=str(out),
    )
    handle = launch_local(req, job.launch)
    assert handle["status"] == "succeeded", handle
    return json.loads(next(out.rglob("metrics.json")).read_text())


def test_vlm_trains_under_ddp_with_two_processes(snap, tmp_path):
    m = _launch(snap, _job(tmp_path, "vlm", "vlm-ddp", max_steps=3), "vlm", tmp_path / "m")
    assert (m["world_size"], m["parallel"], m["step"]) == (2, "ddp", 3)  # step 2 used to fail on unused parameters
    assert all(math.isfinite(x) for x in m["losses"]) and m["eval"]["val"]["n_items"] == 4


def test_encoder_trains_under_ddp_and_fsdp(snap, tmp_path):
    ddp = _launch(snap, _job(tmp_path, "encoder", "enc-ddp", max_steps=3), "encoder", tmp_path / "ddp")
    assert (ddp["world_size"], ddp["parallel"], ddp["step"]) == (2, "ddp", 3)
    fsdp = _launch(
        snap, _job(tmp_path, "encoder", "enc-fsdp", max_steps=3, parallel="fsdp"), "encoder", tmp_path / "fsdp"
    )
    assert (fsdp["world_size"], fsdp["parallel"], fsdp["step"]) == (2, "fsdp", 3)
    assert all(math.isfinite(x) for x in ddp["losses"] + fsdp["losses"])
    # the FSDP checkpoint holds full (unsharded) tensors that load into a plain model
    ckpt = torch.load(next((tmp_path / "fsdp").rglob("last.pt")), weights_only=False)
    assert ckpt["parallel"] == "fsdp" and not any(type(v).__name__ == "DTensor" for v in ckpt["model"].values())
    assert fsdp["eval"]["val"]["n_queries"] > 0


def _gather_worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    from training.scale import gather_rows

    x = torch.full((2, 3), float(rank + 1), requires_grad=True)
    allx, offset = gather_rows(x)
    w = torch.arange(allx.numel(), dtype=torch.float32).view_as(allx)
    (allx * w).sum().backward()
    torch.save({"all": allx.detach(), "offset": offset, "grad": x.grad}, f"{out}/{rank}.pt")
    torch.distributed.destroy_process_group()


def test_gathered_rows_keep_the_gradient_of_the_local_part(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.spawn(_gather_worker, args=(2, port, str(tmp_path)), nprocs=2)
    w = torch.arange(12, dtype=torch.float32).view(4, 3)
    for rank in (0, 1):
        got = torch.load(tmp_path / f"{rank}.pt")
        assert torch.equal(got["all"], torch.tensor([[1.0] * 3] * 2 + [[2.0] * 3] * 2))
        assert got["offset"] == 2 * rank
        assert torch.equal(got["grad"], w[2 * rank : 2 * rank + 2])  # only this process's rows: its own weights
