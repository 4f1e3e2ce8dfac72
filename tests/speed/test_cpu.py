"""The warning for bf16 on a CPU that only emulates it, from real cpuinfo texts."""

import logging

from grpokit.speed.cpu import cpu_flags, has_native_bf16, warn_if_bf16_is_emulated

AVX2_EPYC = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse sse2 avx avx2 fma\n"
AMX_XEON = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"


def test_flags_from_cpuinfo(tmp_path):
    (tmp_path / "epyc").write_text(AVX2_EPYC)
    (tmp_path / "xeon").write_text(AMX_XEON)
    (tmp_path / "arm").write_text("processor\t: 0\nFeatures\t: fp asimd\n")
    assert has_native_bf16(cpu_flags(tmp_path / "epyc")) is False
    assert has_native_bf16(cpu_flags(tmp_path / "xeon")) is True
    assert has_native_bf16(cpu_flags(tmp_path / "arm")) is None  # unknown: no warning
    assert cpu_flags(tmp_path / "missing") is None


def test_warns_once_only_for_emulated_bf16_on_cpu(tmp_path, caplog):
    (tmp_path / "epyc").write_text(AVX2_EPYC)
    avx2 = cpu_flags(tmp_path / "epyc")
    with caplog.at_level(logging.WARNING, logger="grpokit"):
        assert warn_if_bf16_is_emulated(True, "cpu", avx2)
        assert not warn_if_bf16_is_emulated(False, "cpu", avx2)  # float32 run
        assert not warn_if_bf16_is_emulated(True, "cuda", avx2)  # the GPU computes
        assert not warn_if_bf16_is_emulated(True, "cpu", {"avx512_bf16"})
        assert warn_if_bf16_is_emulated(True, "cpu", set())  # flags known, none of them
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "--bf16 false" in lines[0]
