"""The benchmark command ``python -m segattn.bench <part>``: speed, memory and reach, one part at a time.

The parts and their keys are listed in ``__main__``'s docstring, which ``--help`` prints. Each part prints its
tables and writes CSV (and PNG plots where it has them) into its output folder.
"""
