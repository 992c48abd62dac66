"""What a build leaves and what is read back: evidence, inventory, SBOM, image records, reports, scans, waivers."""
