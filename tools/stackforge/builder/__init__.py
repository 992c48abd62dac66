"""From a loaded stack to a gated image, in rooms along the data flow (docs/architecture.md, "Rooms of builder/"):
plan → mirror, records → sources → locks → context → run."""
