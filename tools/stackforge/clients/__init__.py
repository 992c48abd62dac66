"""Clients of everything outside the process: the engine, registries, package indexes, git, upstream fetch, and the
workspace (root, caches, credentials) they share. The steps use these; nothing else spawns docker or git."""
