"""Records -> cells -> member curves -> the verdict; the noise-scale prediction; the simulator.

No TensorFlow: the simulator analyses thousands of studies with NumPy and SciPy only. One owner
each:

    cells           result records -> (member, batch size) cells: the chosen rate and its seeds
    critical_batch  one member's curve: B_x(1+eps), the censored B_crit fit, their intervals
    members         each member's summary (cells, curve, gradient statistics); interval format
    verdict         decide and describe the verdict; `analyze`, the whole chain per target
    prediction      the noise-scale prediction of the critical batch against the sweep
    predict_study   the `predict` study config and its cost (configs import it: light)
    simulate        simulated studies that calibrate the verdict
    stats/          meta-regression, lack of fit, the simulator's curve generators
"""
