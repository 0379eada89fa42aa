"""Other projects' formats and packages that cannot live in the project venv.

``venvs``: where the side venvs are; ``lerobot``: LeRobot policy checkpoints (reading
them, and running the real ``lerobot`` package in its side venv through
``side/lerobot_run.py``, a script that runs there and is never imported here).
"""
