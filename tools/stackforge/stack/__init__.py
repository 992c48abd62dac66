"""The stack: what a stack file says (model), how it is read (load, yamlsrc), its rules, tags and diff."""
