"""Minimum-cost one-to-one assignment (the Hungarian method), for speaker mappings.

cpCER/cpWER and DER/JER each need the one-to-one mapping between reference and
hypothesis speakers that is best for the metric. Speaker counts are small, but a
brute force over permutations grows factorially, so this is the O(n^3)
shortest-augmenting-path form of the Hungarian method on a square matrix
(rectangular problems are padded by the caller, who knows what an unmatched row
or column costs). Written here rather than taken from scipy to keep the
evaluator's dependencies to what the gateway already installs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def minimum_assignment(cost: Sequence[Sequence[float]]) -> tuple[float, list[int]]:
    """Return (total cost, column of each row) of a minimum-cost perfect matching of a square matrix."""
    n = len(cost)
    if n == 0:
        return 0.0, []
    if any(len(row) != n for row in cost):
        raise ValueError("minimum_assignment needs a square matrix")
    # 1-based potentials u (rows) and v (columns); way[j] is the column before j on the augmenting path.
    u = [0.0] * (n + 1)
    v = [0.0] * (n + 1)
    match_of_column = [0] * (n + 1)  # row matched to column j (0: none)
    way = [0] * (n + 1)
    for row in range(1, n + 1):
        match_of_column[0] = row
        column = 0
        reduced = [math.inf] * (n + 1)
        used = [False] * (n + 1)
        while True:
            used[column] = True
            current_row = match_of_column[column]
            delta = math.inf
            next_column = 0
            for j in range(1, n + 1):
                if used[j]:
                    continue
                candidate = cost[current_row - 1][j - 1] - u[current_row] - v[j]
                if candidate < reduced[j]:
                    reduced[j] = candidate
                    way[j] = column
                if reduced[j] < delta:
                    delta = reduced[j]
                    next_column = j
            for j in range(n + 1):
                if used[j]:
                    u[match_of_column[j]] += delta
                    v[j] -= delta
                else:
                    reduced[j] -= delta
            column = next_column
            if match_of_column[column] == 0:
                break
        while column:
            previous = way[column]
            match_of_column[column] = match_of_column[previous]
            column = previous
    columns = [0] * n
    for j in range(1, n + 1):
        columns[match_of_column[j] - 1] = j - 1
    total = sum(cost[i][columns[i]] for i in range(n))
    return float(total), columns
