"""Lock files: the hashes each pip phase must see, and the requirement-file closure a public lock covers."""
