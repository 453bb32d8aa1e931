"""The protocol's checks: stage and pairing validation, severity calibration, the integrity audit."""
