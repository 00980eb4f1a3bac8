"""Reference solutions and hidden test cases of the graded exercises.

Only the grader's own process imports this package. A notebook being graded runs in a
sandbox (``klbook_grader/sandbox.py``) in which this package exists at no path.
"""
