"""Which S3 client the mirror uses, and what the mirror costs a training job, measured side by side.

Part 1 (client choice): boto3, obstore and s3fs each upload and download one checkpoint-sized file
(default 256 MiB) to a moto S3 server on 127.0.0.1, each in a fresh interpreter (so its import
time is its own), with the installed size each adds. A client that is not installed is listed as
such; s3fs pins an older botocore than boto3, so it may be given its own dir: --s3fs-path DIR
(`pip install --target DIR s3fs`).

Part 2 (the goals): a toy job's steps/s while the supervisor uploads its checkpoints against the
same job without --mirror; and a new node's start (download + verify + commit) against a plain
download of the same checkpoint with the same client, and against the same job resuming from the
same checkpoint already on its disk (what no download can beat: the job's own start).

    python bench/bench_mirror.py [--mib 256] [--s3fs-path DIR] [--skip-goals | --new-node-only]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
CLIENTS = {"boto3": ("boto3", "botocore", "s3transfer", "jmespath"), "obstore": ("obstore",),
           "s3fs": ("s3fs", "aiobotocore", "aiohttp", "botocore", "fsspec")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_moto() -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, url
        except OSError:
            time.sleep(0.1)
    raise SystemExit("moto server did not start")


def s3_env(url: str) -> dict[str, str]:
    return {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}


def installed_mib(dists: tuple[str, ...], extra_path: str | None) -> float:
    """Bytes on disk of the distributions a client brings (shared ones counted for each client)."""
    paths = [extra_path] if extra_path else None
    total = 0
    for name in dists:
        try:
            dist = next(iter(metadata.distributions(name=name, path=paths))) if paths else metadata.distribution(name)
        except (StopIteration, metadata.PackageNotFoundError):
            continue
        for f in dist.files or ():
            p = Path(dist.locate_file(f))
            if p.is_file():
                total += p.stat().st_size
    return total / (1 << 20)


# --- one client, in its own interpreter -------------------------------------------------------

def _one(client: str, bucket: str, src: str) -> dict:
    t0 = time.perf_counter()
    if client == "boto3":
        import boto3
        from boto3.s3.transfer import TransferConfig

        imported = time.perf_counter()
        c = boto3.client("s3")
        cfg = TransferConfig(multipart_chunksize=16 << 20, max_concurrency=4)
        up0 = time.perf_counter()
        c.upload_file(src, bucket, "obj", Config=cfg)
        up1 = time.perf_counter()
        c.download_file(bucket, "obj", src + ".back", Config=cfg)
    elif client == "obstore":
        import obstore
        from obstore.store import S3Store

        imported = time.perf_counter()
        st = S3Store(bucket, client_options={"allow_http": True})  # AWS_* from the environment
        up0 = time.perf_counter()
        with open(src, "rb") as f:
            obstore.put(st, "obj", f, chunk_size=16 << 20, max_concurrency=4)
        up1 = time.perf_counter()
        with open(src + ".back", "wb") as f:
            for chunk in obstore.get(st, "obj"):
                f.write(chunk)
    else:
        import s3fs

        imported = time.perf_counter()
        fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": os.environ["AWS_ENDPOINT_URL"]})
        up0 = time.perf_counter()
        fs.put_file(src, f"{bucket}/obj")
        up1 = time.perf_counter()
        fs.get_file(f"{bucket}/obj", src + ".back")
    down1 = time.perf_counter()
    same = os.path.getsize(src) == os.path.getsize(src + ".back")
    os.unlink(src + ".back")
    return {"import_s": imported - t0, "up_s": up1 - up0, "down_s": down1 - up1, "ok": same}


def run_client(client: str, url: str, bucket: str, src: str, s3fs_path: str | None) -> dict | None:
    env = {**os.environ, **s3_env(url)}
    if client == "s3fs" and s3fs_path:
        env["PYTHONPATH"] = s3fs_path
    r = subprocess.run([sys.executable, __file__, "--one", client, "--bucket", bucket, "--src", src],
                       env=env, capture_output=True, text=True)
    if r.returncode != 0:
        return None if "No module named" in r.stderr else {"error": r.stderr.strip().splitlines()[-1]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def clients_table(url: str, mib: int, s3fs_path: str | None) -> None:
    import boto3

    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "ckpt.bin")
        with open(src, "wb") as f:
            for _ in range(mib):
                f.write(os.urandom(1 << 20))
        s3 = boto3.client("s3", **{"endpoint_url": url, "aws_access_key_id": "bench",
                                   "aws_secret_access_key": "bench", "region_name": "us-east-1"})
        print(f"client    import s   upload MiB/s   download MiB/s   installed MiB   ({mib} MiB, moto on 127.0.0.1)")
        for client, dists in CLIENTS.items():
            bucket = f"bench-{client}"
            s3.create_bucket(Bucket=bucket)
            r = run_client(client, url, bucket, src, s3fs_path)
            size = installed_mib(dists, s3fs_path if client == "s3fs" else None)
            if r is None:
                print(f"{client:<9} not installed")
            elif "error" in r:
                print(f"{client:<9} failed: {r['error']}")
            else:
                print(f"{client:<9} {r['import_s']:8.2f}   {mib / r['up_s']:12.0f}   {mib / r['down_s']:14.0f}"
                      f"   {size:13.0f}" + ("" if r["ok"] else "   SIZE MISMATCH"))


# --- part 2: the goals ---------------------------------------------------------------------------

REPO = HERE.parent
TOY = str(REPO / "tests" / "jobs" / "toy_train.py")


def _hidden_for(mib: int) -> int:
    """toy_train's --hidden whose checkpoint (model + Adam's two moments, float32) is about `mib` MiB."""
    return int(((mib << 20) / 12) ** 0.5)


def _events(rd: Path) -> list[dict]:
    return [json.loads(ln) for ln in (rd / "events.jsonl").read_text().splitlines() if ln.strip()]


def _iso(t: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(t).timestamp()


def _train(tmp: Path, name: str, env: dict, mib: int, *mirror: str) -> tuple[float, list[dict]]:
    """(steps/s of the training, events) of one supervised toy run saving ~`mib` MiB every 10 steps,
    its node lost at step 35 (so a new node has steps left to train from the step-30 checkpoint)."""
    rd = tmp / name
    cmd = [sys.executable, "-m", "supervisor", "run", "--run-dir", str(rd), "--no-prestart", "--max-restarts", "0",
           *mirror, TOY, "--hidden", str(_hidden_for(mib)), "--samples", "320", "--epochs", "1", "--save-every", "10",
           "--keep-last", "2", "--out", str(tmp / f"{name}.pt")]
    subprocess.run(cmd, env={**env, "TOY_FAULTS": "1:raise@35"}, capture_output=True, timeout=1800)
    ev = _events(rd)
    first = next(e for e in ev if e["event"] == "first_step")
    end = next(e for e in ev if e["event"] == "attempt_ended")
    return end["step"] / (_iso(end["time"]) - _iso(first["time"])), ev


def _client(url: str):
    import boto3

    return boto3.client("s3", endpoint_url=url, aws_access_key_id="bench", aws_secret_access_key="bench",
                        region_name="us-east-1")


def _new_node(tmp: Path, name: str, env: dict, mib: int, mirror: str, *opts: str) -> tuple[float, dict]:
    """An empty run dir, the same mirror: (supervisor start -> first training step, the restore event)."""
    t0 = time.time()
    subprocess.run([sys.executable, "-m", "supervisor", "run", "--run-dir", str(tmp / name), *opts,
                    "--mirror", mirror, TOY, "--hidden", str(_hidden_for(mib)), "--samples", "320", "--epochs", "1",
                    "--save-every", "10", "--keep-last", "2", "--out", str(tmp / f"{name}.pt")],
                   env=env, check=True, capture_output=True, timeout=1800)
    ev = _events(tmp / name)
    first_step = _iso(next(e for e in ev if e["event"] == "first_step")["time"]) - t0
    return first_step, next(e for e in ev if e["event"] == "checkpoint_restored_from_mirror")


def _local_start(tmp: Path, env: dict, mib: int, lost: Path) -> float:
    """The floor under the new-node figure: the same supervised job resuming from the same checkpoint
    already on its disk (the lost node's checkpoints copied into a fresh run dir, no mirror),
    supervisor start -> first training step."""
    rd = tmp / "local-start"
    shutil.copytree(lost / "checkpoints", rd / "checkpoints", symlinks=True)
    t0 = time.time()
    subprocess.run([sys.executable, "-m", "supervisor", "run", "--run-dir", str(rd), TOY, "--hidden",
                    str(_hidden_for(mib)), "--samples", "320", "--epochs", "1", "--save-every", "10", "--keep-last", "2",
                    "--out", str(tmp / "local-start.pt")], env=env, check=True, capture_output=True, timeout=1800)
    return _iso(next(e for e in _events(rd) if e["event"] == "first_step")["time"]) - t0


def _copy_prefix(s3, src: str, dst: str) -> str:
    """A server-side copy of every object under `src` to `dst` (bucket bench-goals); `dst` without its slash."""
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket="bench-goals", Prefix=src):
        for o in page.get("Contents", []):
            s3.copy({"Bucket": "bench-goals", "Key": o["Key"]}, "bench-goals", dst + o["Key"][len(src):])
    return dst.rstrip("/")


def _plain_download(s3, tmp: Path, url: str) -> float:
    """The plain download of the same checkpoint with the same client (boto3, same part size)."""
    from boto3.s3.transfer import TransferConfig

    cfg = TransferConfig(multipart_threshold=16 << 20, multipart_chunksize=16 << 20, max_concurrency=4)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="bench-goals", Prefix=url[len("s3://bench-goals/"):] + "/")["Contents"]]
    d0 = time.time()
    for i, k in enumerate(keys):
        s3.download_file("bench-goals", k, str(tmp / f"plain-{i}"), Config=cfg)
    return time.time() - d0


def goals_table(url: str, mib: int, upload_goal: bool = True) -> None:
    env = {**os.environ, **s3_env(url), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    s3 = _client(url)
    s3.create_bucket(Bucket="bench-goals")
    mirror = "s3://bench-goals/toy"
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        rows = []
        if upload_goal:
            # Baseline before and after the mirrored run: the mean cancels a drift in the machine's load.
            before, _ = _train(tmp, "plain", env, mib)
            with_mirror, ev = _train(tmp, "mirrored", env, mib, "--mirror", mirror)
            after, _ = _train(tmp, "plain-again", env, mib)
            base = (before + after) / 2
            uploads = [e for e in ev if e["event"] == "checkpoint_mirrored"]
            size = sum(e["bytes"] for e in uploads) / max(1, len(uploads)) / (1 << 20)
            rows.append(f"steps/s while uploading / without          {with_mirror / base:6.3f}   >= 0.95   "
                        f"({with_mirror:.2f} vs {base:.2f} steps/s, {len(uploads)} uploads of ~{size:.0f} MiB)")
        else:
            _train(tmp, "mirrored", env, mib, "--mirror", mirror)
        # What no download can beat: the job's own start, resuming from a checkpoint already on disk
        # (measured first: the downloads below leave hundreds of MiB of dirty pages to write back).
        floor = _local_start(tmp, env, mib, tmp / "mirrored")
        # Default: the first attempt's interpreter imports torch while the checkpoint downloads.
        firsts: list[float] = []
        for i, (label, opts) in enumerate((("new node: start -> first step / download", ()),
                                           ("  the same with --no-prestart", ("--no-prestart",)))):
            # Each new node gets its own copy of the lost node's prefix: the one before uploaded its final step.
            prefix = _copy_prefix(s3, "toy/", f"node{i}/")
            first_step, restored = _new_node(tmp, f"new-node{i}", env, mib, f"s3://bench-goals/{prefix}", *opts)
            download = _plain_download(s3, tmp, restored["url"])
            rows.append(f"{label:42s} {first_step / download:6.2f}   <= 1.5    "
                        f"({first_step:.1f}s vs {download:.1f}s; restore itself {restored['seconds']:.1f}s)")
            firsts.append(first_step)
        rows.append(f"{'new node / the same job from a local copy':42s} {firsts[0] / floor:6.2f}   -        "
                    f"({firsts[0]:.1f}s vs {floor:.1f}s: the download's cost on top of the job's own start)")
    print("\ngoal                                       measured   goal")
    print("\n".join(rows))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--one")
    ap.add_argument("--bucket")
    ap.add_argument("--src")
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--s3fs-path")
    ap.add_argument("--skip-goals", action="store_true")
    ap.add_argument("--new-node-only", action="store_true", help="only the new-node goal (no client table, no steps/s)")
    a = ap.parse_args()
    if a.one:
        print(json.dumps(_one(a.one, a.bucket, a.src)))
        return
    proc, url = start_moto()
    try:
        if not a.new_node_only:
            clients_table(url, a.mib, a.s3fs_path)
        if not a.skip_goals:
            goals_table(url, a.mib, upload_goal=not a.new_node_only)
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
