from rloo.eval.judge import PolicyEval, evaluate_policy, win_rate

__all__ = ["PolicyEval", "evaluate_policy", "win_rate"]
