"""Publishing a gated image: the registry client, the publisher and the nightly."""
