"""The compiled modules: the CommitLog's record writer (common/format/record_writer.py), the
client protocol's request and answer checks (common/format/protocol.py), the HA protocol's DATA
and ACK (common/ha/protocol.py), reput's record scan (common/store/reput.py) and the gRPC front
end's received messages (common/proxy/convert.py); see common/core/accel.py.

``optional=True``: where no C compiler, Python headers or zlib headers are found, the build
goes on without it and the pure-Python writer runs (the same bytes, slower).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "common.format._record_writer",
            sources=["common/format/_record_writer.c"],
            depends=["common/format/_record_core.h"],
            libraries=["z"],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        ),
        Extension(
            "common.format._codec",
            sources=["common/format/_codec.c", "common/format/_put_path.c"],
            depends=["common/core/_native_helpers.h", "common/format/_codec_internal.h",
                     "common/format/_record_core.h"],
            libraries=["z"],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        ),
        Extension(
            "common.ha._ha_codec",
            sources=["common/ha/_ha_codec.c"],
            depends=["common/core/_native_helpers.h"],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        ),
        Extension(
            "common.proxy._received",
            sources=["common/proxy/_received.c"],
            depends=["common/format/_record_core.h"],
            libraries=["z"],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        ),
        Extension(
            "common.store._reput_scan",
            sources=["common/store/_reput_scan.c"],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        ),
    ]
)
