"""The read knobs of DiffusionGemma's structured reads, as the jev overlay's range serves them
(vllm.entrypoints.jev.canvas in the image): the model's canvas (256 tokens, 48 denoising steps) as vllm serve's
--diffusion-config, and each request's vllm_xargs checked before it reaches the engine — the five knobs the port
reads, a width no wider than the served canvas, a seed canvas of that width, pinned positions inside it.
Declared in recipes/diffusion-gemma.yaml (tests.knobs); it runs in the jev image and needs no device.
"""

import json

import pytest

from vllm.entrypoints.jev.canvas import READ_KNOBS, check_xargs, diffusion_config


def test_the_served_canvas_is_the_models():
    assert json.loads(diffusion_config()) == {"canvas_length": 256, "max_denoising_steps": 48}


def test_the_five_read_knobs_the_port_reads():
    assert READ_KNOBS == (
        "diffusion_canvas_length",
        "diffusion_seed_canvas",
        "diffusion_pinned",
        "diffusion_read_only",
        "diffusion_max_steps",
    )


def test_a_narrower_canvas_with_its_seed_and_pins_is_accepted():
    xargs = {"diffusion_canvas_length": 4, "diffusion_seed_canvas": [1, 2, 3, 4], "diffusion_pinned": [0, 3]}
    assert check_xargs({**xargs, "temperature": 0}) == xargs


@pytest.mark.parametrize(
    "xargs, why",
    [
        ({"diffusion_canvas": 8}, "unknown diffusion knob(s): diffusion_canvas"),
        ({"diffusion_canvas_length": 257}, "is not between 1 and the served canvas 256"),
        ({"diffusion_canvas_length": 4, "diffusion_seed_canvas": [1, 2]}, "holds 2 ids for a canvas of 4"),
        ({"diffusion_canvas_length": 4, "diffusion_pinned": [4]}, "position 4 is outside the canvas of 4"),
    ],
)
def test_a_read_the_port_would_refuse_is_refused_before_the_engine(xargs, why):
    with pytest.raises(ValueError, match=why.replace("(", r"\(").replace(")", r"\)")):
        check_xargs(xargs)
