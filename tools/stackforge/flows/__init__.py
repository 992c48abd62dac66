"""Flows across the steps: the nightly, the doctor, the operator's pull and verify, and the mirror writer."""
