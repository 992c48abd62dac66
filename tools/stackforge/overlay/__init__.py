"""The patch overlay: a numbered series of patches applied onto a pinned upstream.

Modules, along the data flow:

- ``series``    read/write ``series`` files, layers (base series + layered ranges), names, hashes
- ``patchfile`` parse one patch file (headers, message, per-file hunks, added lines)
- ``git``       run git with an isolated, deterministic environment
- ``repo``      turn an upstream export into a git repository to apply onto
- ``apply``     ``git am -3`` one patch at a time, with diagnosis and resumable state
- ``check``     classify each patch (clean / offset / 3-way / fails / upstreamed)
- ``export``    ``git format-patch`` back into the series, byte-stable, renumbering
- ``upstreamed`` find patches a new upstream already carries; drop them
- ``rangediff`` ``git range-diff`` of the series applied on two pins
- ``lint``      static checks over series directories
- ``index``     the generated README index

``stackforge.patches`` re-exports the public API.
"""
