"""The benchmark command ``python -m segattn.bench <part>``: speed, memory and reach, one part at a time.

``--help`` lists the parts (``__main__``'s docstring), ``<part> --help`` a part's keys. Each part prints its
tables and writes CSV (and PNG plots where it has them) into its output folder.
"""
