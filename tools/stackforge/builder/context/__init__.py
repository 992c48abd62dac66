"""The build context and its Dockerfile, assembled on the host: the one path render, build and bake share."""
