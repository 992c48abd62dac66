"""Layered images: ``overlays/<name>/overlay.yaml`` (``model``, ``load``), how a layered range reaches the image
(``range``), the build (``build``), publish (``publish``) and verify (``verify``)."""
