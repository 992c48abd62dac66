"""From a loaded stack to a gated image: plan, sources, locks, context, render, engine, run, bake, gate, verify."""
