"""The build plan and its Dockerfile, derived from the stack: phases, system and target stages, render."""
