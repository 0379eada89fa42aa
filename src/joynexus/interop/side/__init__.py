"""Scripts that run inside side venvs, never imported by JoyNexus (its own directory, so
the script's directory on ``sys.path`` shadows no package such as ``lerobot``)."""
