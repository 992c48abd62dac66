# The peer for bench/build_bench.py: what a hand-kept Dockerfile usually looks like.
# One stage: copy everything, then install the pins, build the upstream and run the gate.
# Same content as the stage-ordered build of the example stack (same pins, patched source, gate).
FROM stackforge/base:bookworm
ENV PATH=/opt/venv/bin:$PATH
COPY . /stackforge/
RUN --mount=type=secret,id=cabundle \
    if [ -s /run/secrets/cabundle ]; then export PIP_CERT=/run/secrets/cabundle; fi; \
    python3 -m venv /opt/venv \
 && python -m pip install --index-url https://pypi.org/simple/ -r /stackforge/deps/pypi.txt \
 && cd /stackforge/src/markupsafe \
 && MARKUPSAFE_REQUIRE_SPEEDUPS=1 python -m pip wheel --no-build-isolation --no-deps --wheel-dir /tmp/wheels . \
 && python -m pip install --no-index --no-deps /tmp/wheels/*.whl \
 && python /stackforge/gate/gate.py /stackforge/gate/gate.json
