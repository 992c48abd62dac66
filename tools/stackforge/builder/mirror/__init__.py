"""The offline mirror: its manifest and layout, its apt and toolchain parts, and the offline build's side of it."""
