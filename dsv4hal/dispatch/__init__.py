"""How a bound op reaches its kernel.

    platform.ops.X(*args)                      BoundOp.__call__ (bound_op.py)
      -> FastPath.find(args)                   argument metadata that passed before -> its kernel (fast_path.py)
      -> validate, then Dispatcher.choose(case) the case's Choice: implementation, kernel, decision (dispatcher.py)
      -> choice.kernel(*args)                  the function the registration's "module:function" target names

An op with prepared weights (WeightedOp, weighted_op.py) runs the implementation the weights were prepared for
(Dispatcher.choose_fixed). `op.plan(*args)` validates once and returns choice.kernel itself, for hot loops and
graph capture. Every table holds at most bounded.LIMIT entries."""
