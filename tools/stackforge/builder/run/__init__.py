"""The engine side: build, bake, gate, registry cache, the no-op build, and verify."""
