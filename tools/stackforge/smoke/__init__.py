"""``stackforge smoke``: start a built image as the recipe says and prove it serves.

``run`` starts the container (the recipe's serve flags, env defaults and ports, the platform's device
options), runs the preflight row inside it, waits for readiness while watching that it still runs, runs
the recipe's smoke rows and always removes the container; ``report`` holds the per-row results and
writes the evidence (``smoke.json`` and the container log).
"""
