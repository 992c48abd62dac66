"""Mirrors: everything a build of one stack needs, in one directory, for a build host with no network.

``stackforge mirror STACK --to DIR`` (:mod:`stackforge.mirror.make`) writes::

    DIR/mirror.json                      the manifest: every part with its source (redacted), sha256 and size
    DIR/git/<upstream>.git               a bare repository holding the pinned commit and tag of a git upstream
    DIR/sdist/<file>.tar.gz              the release sdist of an sdist upstream
    DIR/indexes/<index>/files/<file>     every wheel (and sdist) a pip phase of that index installs
    DIR/indexes/<index>/simple/…         a static PEP 503 tree over those files, links carrying #sha256=
    DIR/base/image.tar                   the base image (``docker save``: an OCI layout from Docker 25 on)

``stackforge build STACK --offline --mirror DIR`` (:mod:`stackforge.mirror.offline`) builds from it with the
engine's network disabled: upstreams come from DIR/git and DIR/sdist, each pip phase reads its index's tree
bind-mounted from the build context as a ``file://`` index, and the base image is loaded from DIR/base.
"""
