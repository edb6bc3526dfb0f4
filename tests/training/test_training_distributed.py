"""Several processes on CPU (gloo): the VLM and the encoder train under DDP through the local launcher (torchrun),
both under FSDP2 (the VLM with each process's own parameter shards checked), and the all-gather of negatives keeps
the gradient on each process's own rows."""

from __future__ import annotations

import json
import math
import os
import socket
import time

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


def _fsdp_vlm_worker(rank: int, world: int, port: int, root: str, cfg: str, out: str) -> None:
    """One process of an FSDP2 VLM run: trains through ``training.loop.train`` and saves, for its own shards, how
    many trainable parameters changed against the weights the model was built with."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank)
    )
    from torch.distributed.tensor import DTensor

    from etl.storage import Storage
    from training.config import load_job_config
    from training.data import open_snapshot_once
    from training.loop import setup_runtime, train
    from training.tasks import VLMTask

    class Watched(VLMTask):
        def build_model(self):
            self.model = super().build_model()
            self.initial = {n: p.detach().clone() for n, p in self.model.named_parameters()}
            return self.model

    job = load_job_config(cfg)
    rt = setup_runtime(job.optim)
    task = Watched(job, open_snapshot_once(Storage.open(root), "0.1.0"), f"{out}/run")
    metrics = train(task, job.optim, f"{out}/run", rt)
    task.model.reshard()  # the root keeps its parameters gathered after the last (evaluation) forward
    rows = []
    for name, p in task.model.named_parameters():
        if not p.requires_grad:
            continue
        sharded = isinstance(p, DTensor)
        local = (p.to_local() if sharded else p).detach().cpu()
        parts = torch.chunk(task.initial[name], world, dim=0) if sharded else [task.initial[name]] * world
        init = parts[rank] if rank < len(parts) else task.initial[name][:0]
        assert local.shape == init.shape, (name, local.shape, init.shape)  # FSDP2: dim-0 chunks, this rank's one
        if local.numel():
            rows.append((name, sharded, not torch.equal(local, init)))
    torch.save({"rows": rows, "losses": metrics["losses"], "parallel": metrics["parallel"]}, f"{out}/{rank}.pt")
    torch.distributed.destroy_process_group()


def test_vlm_trains_under_fsdp_and_updates_the_shards_of_both_processes(snap, tmp_path):
    cfg = _job(tmp_path, "vlm", "vlm-fsdp", max_steps=3, parallel="fsdp")
    d = yaml.safe_load(open(cfg).read())
    d["data"]["eval_splits"] = ["val"]
    open(cfg, "w").write(yaml.safe_dump(d))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = torch.multiprocessing.spawn(
        _fsdp_vlm_worker, args=(2, port, snap.root, cfg, str(tmp_path)), nprocs=2, join=False
    )
    deadline = time.monotonic() + 400
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("the FSDP VLM run did not finish in 400 s")
    got = [torch.load(tmp_path / f"{rank}.pt") for rank in (0, 1)]
    for rank, g in enumerate(got):
        assert g["parallel"] == "fsdp" and len(g["losses"]) == 3
        assert all(math.isfinite(x) for x in g["losses"])
        sharded = [r for r in g["rows"] if r[1]]
        # every trainable parameter is sharded, and every shard this process holds moved in 3 AdamW steps
        assert len(sharded) == len(g["rows"]) > 20, rank
        assert [r[0] for r in g["rows"] if not r[2]] == [], rank
        assert any(n.startswith("lm.") for n, _, _ in sharded) and any(n.startswith("vision.") for n, _, _ in sharded)
    assert got[0]["losses"] == got[1]["losses"]  # one all-reduced loss per step
