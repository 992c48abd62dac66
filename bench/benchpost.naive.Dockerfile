# The peer of bench/build_bench.py for the benchmark stack (bench/stacks/benchpost.yaml): what a hand-kept
# Dockerfile usually looks like. One stage: copy everything, install the vendor wheels, the public pins and
# the vendor wheels' dependencies, compile the patched zstandard and run the same gate. The context is the
# one `stackforge render benchpost` writes (deps/, src/zstandard patched, gate/), so both build the same.
FROM stackforge/base:bookworm
ARG VENDOR_INDEX
ARG PUBLIC_INDEX
ENV PATH=/opt/venv/bin:$PATH PIP_DISABLE_PIP_VERSION_CHECK=1
COPY . /stackforge/
RUN python3 -m venv /opt/venv \
 && python -m pip install --index-url "$VENDOR_INDEX" --no-deps -r /stackforge/deps/vendor.txt \
 && python -m pip install --index-url "$PUBLIC_INDEX" -c /stackforge/deps/constraints.txt -r /stackforge/deps/public.txt \
 && python -m pip install --index-url "$PUBLIC_INDEX" -c /stackforge/deps/constraints.txt -r /stackforge/deps/vendor.deps.txt \
 && cd /stackforge/src/zstandard \
 && ZSTD_BACKENDS=c python -m pip wheel --no-build-isolation --no-deps --wheel-dir /tmp/wheels . \
 && python -m pip install --no-index --no-deps /tmp/wheels/*.whl \
 && PYTHONDONTWRITEBYTECODE=1 python /stackforge/gate/gate.py /stackforge/gate/gate.json
