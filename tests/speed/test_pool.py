"""The CPU tensor pool (grpokit/speed/pool.py): blocks reused and merged, small tensors left
to torch's allocator, correct values through oneDNN's raw allocations, fork, page release,
and the config switch. The pool is process-wide, so each check runs in a fresh process."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from grpokit.speed import pool

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
needs_cxx = pytest.mark.skipif(
    not (shutil.which("c++") or shutil.which("g++")),
    reason="no C++ compiler: the pool is not built",
)

MiB = 1 << 20


def run_fresh(body: str) -> None:
    """``body`` in a new interpreter with the pool installed (``pool`` and ``torch``
    imported); fails with its output when it fails."""
    code = "import os, torch\nfrom grpokit.speed import pool\nassert pool.install()\n"
    code += textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


@linux_only
@needs_cxx
def test_a_freed_block_is_reused_and_neighbours_merge():
    run_fresh(
        f"""
        MiB = {MiB}
        s0 = pool.stats()
        a = torch.empty(4 * MiB, dtype=torch.uint8)
        ptr, top = a.data_ptr(), pool.stats()["top"]
        assert pool.stats()["in_use"] == s0["in_use"] + 4 * MiB
        del a
        b = torch.empty(4 * MiB, dtype=torch.uint8)
        assert b.data_ptr() == ptr and pool.stats()["top"] == top  # the same block again
        x = torch.empty(MiB, dtype=torch.uint8)
        y = torch.empty(MiB, dtype=torch.uint8)
        z = torch.empty(MiB, dtype=torch.uint8)  # keeps y's end from merging with the top
        assert y.data_ptr() == x.data_ptr() + MiB
        top = pool.stats()["top"]
        del x, y
        w = torch.empty(2 * MiB, dtype=torch.uint8)  # fits only in x and y merged
        assert pool.stats()["top"] == top
        del b, z, w
        assert pool.stats()["in_use"] == s0["in_use"]
        """
    )


@linux_only
@needs_cxx
def test_small_tensors_stay_with_torch_and_sizes_round_to_pages():
    run_fresh(
        """
        s0 = pool.stats()
        small = [torch.empty(1000) for _ in range(100)]  # 4 KB each
        assert pool.stats()["in_use"] == s0["in_use"]
        odd = torch.empty(300_001, dtype=torch.uint8)
        assert pool.stats()["in_use"] - s0["in_use"] == -(-300_001 // 4096) * 4096
        assert odd.data_ptr() % 4096 == 0
        """
    )


@linux_only
@needs_cxx
def test_values_through_products_autograd_and_raw_allocations():
    # bf16 products go through oneDNN, whose scratch space torch allocates raw
    # (raw_allocate / raw_deallocate route through the pool's deleter)
    run_fresh(
        """
        g = torch.Generator().manual_seed(0)
        a = torch.randn(512, 768, generator=g)
        b = torch.randn(768, 640, generator=g, requires_grad=True)
        want = (a.double() @ b.detach().double())
        for _ in range(3):
            got = a @ b
            assert torch.allclose(got.double(), want, rtol=1e-4, atol=1e-3)
            got.square().sum().backward()
        ref = (a.bfloat16() @ b.detach().bfloat16()).float()
        assert torch.allclose(ref, want.float(), rtol=0.05, atol=0.5)
        b16 = torch.randn(2048, 2048, generator=g).bfloat16()
        c = b16 @ b16
        assert torch.isfinite(c.float()).all()
        assert b.grad.shape == b.shape and torch.isfinite(b.grad).all()
        """
    )


@linux_only
@needs_cxx
def test_a_forked_child_allocates_and_frees():
    run_fresh(
        """
        # (no parallel op in the parent before the fork: libgomp hangs a child after one)
        keep = torch.empty(8 << 20)
        pid = os.fork()
        if pid == 0:
            torch.set_num_threads(1)
            keep.fill_(1.0)
            t = torch.full((4 << 20,), 2.0)
            ok = float(t.sum()) == 2.0 * (4 << 20) and float(keep.sum()) == 8 << 20
            del t
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        """
    )


@linux_only
@needs_cxx
def test_release_returns_free_pages_and_blocks_work_after():
    run_fresh(
        """
        def rss():
            return int(open("/proc/self/statm").read().split()[1]) * 4096
        t = torch.ones(64 << 20, dtype=torch.uint8)  # 64 MiB, touched
        hold = torch.ones(1 << 20, dtype=torch.uint8)  # after it: the range cannot shrink
        before = rss()
        del t
        assert pool.release() >= 64 << 20
        assert rss() < before - (32 << 20)
        u = torch.full((64 << 20,), 7, dtype=torch.uint8)  # the same pages, faulted in again
        assert int(u[::4096].sum()) == 7 * (16 << 10) and int(hold.sum()) == 1 << 20
        """
    )


def test_the_trainer_installs_it_only_when_asked(monkeypatch, tmp_path):
    from grpokit import setup
    from grpokit.config import GRPOConfig

    calls = []
    monkeypatch.setattr(setup, "install_pool", lambda: calls.append(1))
    monkeypatch.setattr(
        "grpokit.models.load_model_and_tokenizer",
        lambda *a, **k: (_ for _ in ()).throw(RuntimeError("stop")),
    )
    for flag, device, want in ((True, "cpu", 1), (False, "cpu", 0), (True, "meta", 0)):
        cfg = GRPOConfig(output_dir=str(tmp_path), cpu_memory_pool=flag)
        calls.clear()
        with pytest.raises(RuntimeError, match="stop"):
            setup.build_models(cfg, torch.device(device), strategy=None)
        assert len(calls) == want, (flag, device)


@linux_only
def test_without_a_compiler_torch_keeps_its_allocator(monkeypatch, tmp_path):
    monkeypatch.setattr(pool, "_lib", None)
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.setattr(pool, "library_path", lambda: tmp_path / "pool.so")
    assert pool.install() is False and pool.stats() is None and pool.release() == 0
    monkeypatch.setattr(pool, "_lib", None)
    monkeypatch.setenv("GRPOKIT_NO_POOL", "1")
    assert pool.install() is False


@linux_only
@needs_cxx
def test_an_address_space_limit_bounds_the_reserved_range():
    # (in the child: the limit is set before the pool is installed)
    code = (
        "import resource; resource.setrlimit(resource.RLIMIT_AS, (64 << 30, 64 << 30))\n"
        "import torch\nfrom grpokit.speed import pool\nassert pool.install()\n"
        "assert pool.stats()['reserved'] == 16 << 30, pool.stats()\n"
        "t = torch.ones(8 << 20); assert float(t.sum()) == 8 << 20\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
