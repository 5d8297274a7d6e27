"""The benchmark command ``python -m segattn.bench {op,model,maxres,all}``: speed, memory and reach.

``op`` times each attention variant's token mixing against the memory-traffic floor, ``model`` times a
full training step, ``maxres`` finds the largest image that trains in a memory budget. Each part prints a
table and writes CSV + PNG into the run directory.
"""
