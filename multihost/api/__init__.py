"""The Python API's home: each public function's module (``multihost`` exports them lazily,
so importing this package loads nothing heavy).

runs      run / run_async / status / attach / kill / pull / stacks / make_fleet
call      call: a function by value to every host, its values back
sweep     run_sweep: the sweep command from Python, its ranked summary as a value
keywords  what each function accepts and refuses (the schema's settings by dest), checked,
          layered over a profile, planned; where a run's events go
"""
