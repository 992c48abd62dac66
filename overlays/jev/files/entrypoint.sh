#!/bin/sh
# The jev overlay's entrypoint: serve $MODEL with vLLM's OpenAI API on $PORT, wait until /v1/models answers
# there, then start the interposer on $API_PORT in front of it. The overrides default to the image's ENV;
# arguments are passed on to vllm serve. SIGTERM/SIGINT go to both servers; the exit status is vLLM's.
set -u

MODEL="${MODEL:-google/diffusiongemma-26B-A4B-it}"
SERVED_NAME="${SERVED_NAME:-diffusiongemma}"
PORT="${PORT:-8000}"
API_PORT="${API_PORT:-18011}"
CANVAS="${CANVAS:-256}"
DENOISE_STEPS="${DENOISE_STEPS:-48}"
GMEM="${GMEM:-0.75}"
MAX_LEN="${MAX_LEN:-4096}"
BACKEND="${BACKEND:-TRITON_ATTN}"

# The canvas as vllm serve takes it, from the overlay's own module (it checks the values).
DIFFUSION_CONFIG=$(python -m vllm.entrypoints.jev.canvas "$CANVAS" "$DENOISE_STEPS") || exit 2

vllm serve "$MODEL" --served-model-name "$SERVED_NAME" --host 0.0.0.0 --port "$PORT" \
    --max-model-len "$MAX_LEN" --gpu-memory-utilization "$GMEM" --attention-backend "$BACKEND" \
    --diffusion-config "$DIFFUSION_CONFIG" "$@" &
VLLM=$!
INTERPOSER=""

stop() {
    trap - TERM INT
    kill -TERM "$VLLM" $INTERPOSER 2>/dev/null
    wait "$VLLM"
    status=$?
    [ -n "$INTERPOSER" ] && wait "$INTERPOSER"
    exit "$status"
}
trap stop TERM INT

ready() {
    python -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' \
        "http://127.0.0.1:$PORT/v1/models" >/dev/null 2>&1
}

until ready; do
    if ! kill -0 "$VLLM" 2>/dev/null; then
        wait "$VLLM"
        status=$?
        echo "entrypoint: vllm serve exited with status $status before /v1/models answered on port $PORT" >&2
        exit "$status"
    fi
    sleep 1
done
echo "entrypoint: vLLM answers on port $PORT; starting the interposer on port $API_PORT" >&2

python /opt/jev/interposer.py --upstream "http://127.0.0.1:$PORT" --port "$API_PORT" &
INTERPOSER=$!

while kill -0 "$VLLM" 2>/dev/null && kill -0 "$INTERPOSER" 2>/dev/null; do
    sleep 1
done
stop
