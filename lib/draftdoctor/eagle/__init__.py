"""The kit's CPU EAGLE-3 engine: the target (`llama`), the draft (`draft`), greedy speculative decoding
(`engine`), a draft placed as an engine release's loader leaves it (`loading`), and the target's
recorded continuations (`teacher`). The prediction of acceptance (`predict.py`) and the reference
backend (`reference/`) both run it; it imports nothing above the coverage report.
"""
