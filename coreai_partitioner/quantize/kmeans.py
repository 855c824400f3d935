"""K-means look-up tables for groups of rows: 1-D Lloyd iterations over a fine histogram, every group at once.

A group is ``group`` consecutive rows of a 2-D weight (for a Linear, that many
output channels, each with all its input channels).  Each group gets
``2 ** bits`` centroids, the look-up table, and each weight the index of its
centroid.  :func:`cluster_rows` clusters a whole weight in a few tensor
passes instead of one group at a time:

1. each row group's values are binned into ``bins`` equal bins between the
   group's minimum and maximum (``bincount`` of the bin numbers and of the
   values, then prefix sums: every group's histogram and running totals);
2. Lloyd's iterations run on the histograms of all groups together: the
   decision boundaries are the midpoints between neighbouring centroids, each
   cluster is a run of bins, and its new centroid is the exact mean of the
   values in it (from the running totals, so an iteration costs
   ``O(groups x centroids)``, not a pass over the weights); they start from
   the quantiles and stop when no boundary moves (at most ``iterations``);
3. each weight takes the cluster of its bin.

Centroids are the exact means of the weights given to them; a weight in the
bin a boundary falls in may go to the farther of its two neighbours (off by
at most one bin, ``1 / bins`` of the group's range).  Groups are binned in
chunks of about ``chunk`` values and iterated in batches of at most about
``batch`` int32s of bins and running totals, so the working memory is bounded
whatever the weight's size.  coreai-opt's ``KMeansPalettizer`` instead solves 1-D
k-means exactly (dynamic programming over each group's distinct values), one
group after another: 9 s for one 14336 x 4096 weight here, about 20 minutes
for 8B weights, where this takes about 3 s; on SmolLM2-135M's weights its
squared error is 1% to 6% lower (README's compression table).
"""

from __future__ import annotations

import torch

__all__ = ["cluster_rows", "bin_count"]

#: Histogram bins per centroid (at most ``MAX_BINS`` per group): fine enough that weights with rare large values
#: (a maximum ten standard deviations out) still fall in bins far narrower than any cluster.
BINS_PER_CENTROID = 1024
MAX_BINS = 1 << 16
#: Values binned at a time.
CHUNK = 8 << 20
#: Groups iterated together hold at most about this many int32s (each value's bin, and their histograms' running
#: totals; 256 MB): one iteration is a dozen small tensor operations, whose fixed cost dominates at a chunk's 64
#: groups of a 4096-wide Linear.
BATCH = 64 << 20


def bin_count(bits: int) -> int:
    """Histogram bins per group for ``2 ** bits`` centroids."""
    return min(BINS_PER_CENTROID << bits, MAX_BINS)


@torch.no_grad()
def cluster_rows(
    weight: torch.Tensor, bits: int, group: int, *, iterations: int = 300, chunk: int = CHUNK, batch: int = BATCH
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """``(indices, centroids, error)`` of a 2-D ``weight`` whose rows are clustered ``group`` at a time.

    ``indices`` is ``uint8`` with ``weight``'s shape; ``centroids`` is
    ``[rows / group, 2 ** bits]`` float64, sorted per group;
    ``error`` is the squared difference between the weights and their
    centroids relative to the weights' (``|W - W'|^2 / |W|^2``).  ``rows`` must be a multiple of ``group`` and
    the weights finite (the callers check both, naming the layer).

    Values are binned about ``chunk`` at a time; the histograms of about ``batch`` values' groups are iterated
    together (a converged group is a fixed point of an iteration, so how groups are batched does not change a
    number: the batch only sets how many small tensor operations the iterations cost).
    """
    rows, cols = weight.shape
    k, bins = 1 << bits, bin_count(bits)
    groups = weight.reshape(rows // group, group * cols)
    n = groups.shape[1]
    centroids = torch.empty(groups.shape[0], k, dtype=torch.float64)
    indices = torch.empty(groups.shape, dtype=torch.uint8)
    squared_error = torch.zeros((), dtype=torch.float64)
    squared = torch.zeros((), dtype=torch.float64)
    step = max(1, chunk // max(n, bins))
    # groups iterated together: their bins as int32 (n each) and histograms as two float64 running totals (4 bins'
    # worth of int32 each) within about ``batch`` int32s
    together = step * max(1, batch // (step * max(n, 4 * bins)))
    quantiles = (torch.arange(k, dtype=torch.float64) + 0.5) / k * n
    for first_group in range(0, groups.shape[0], together):
        b = min(together, groups.shape[0] - first_group)
        counts = torch.zeros(b, bins + 1, dtype=torch.float64)  # running totals, a zero in front
        sums = torch.zeros(b, bins + 1, dtype=torch.float64)
        low = torch.empty(b, 1, dtype=torch.float64)
        scale = torch.empty(b, 1, dtype=torch.float64)
        squares = torch.empty(b, dtype=torch.float64)
        binned = torch.empty(b, n, dtype=torch.int32)  # each value's bin, numbered within its chunk
        chunks = [slice(at, min(at + step, b)) for at in range(0, b, step)]
        for part in chunks:
            values = groups[first_group + part.start : first_group + part.stop].float()
            g = values.shape[0]
            least = values.amin(1, keepdim=True)
            spread = bins / (values.amax(1, keepdim=True) - least).clamp(min=torch.finfo(torch.float32).tiny)
            chunk_bins = binned[part]  # rows of the batch's bins: contiguous, written in place
            chunk_bins.copy_(torch.sub(values, least).mul_(spread)).clamp_(0, bins - 1)  # the copy truncates
            chunk_bins += torch.arange(0, g * bins, bins, dtype=torch.int32).unsqueeze(1)
            flat = chunk_bins.view(-1)
            torch.cumsum(torch.bincount(flat, minlength=g * bins).view(g, bins), 1, out=counts[part, 1:])
            torch.cumsum(torch.bincount(flat, weights=values.view(-1), minlength=g * bins).view(g, bins), 1, out=sums[part, 1:])
            squares[part] = values.double().square_().sum(1)
            low[part], scale[part] = least.double(), spread.double()
            del values, chunk_bins, flat
        first = torch.searchsorted(counts[:, 1:].contiguous(), quantiles.expand(b, k).contiguous()).clamp_(max=bins - 1)
        centre = low + (first + 0.5) / scale
        edges = _edges(centre, low, scale, bins)
        for _ in range(iterations):
            centre = _means(edges, counts, sums, centre)
            moved = _edges(centre, low, scale, bins)
            if torch.equal(moved, edges):
                break
            edges = moved
        else:
            centre = _means(edges, counts, sums, centre)
        centroids[first_group : first_group + b] = centre
        members, total = _clusters(edges, counts, sums)
        errors = (squares - (total.square() / members.clamp(min=1)).sum(1)).clamp_(min=0)
        # a bin's cluster is the number of boundaries at or below it
        marks = torch.zeros(b, bins + 1, dtype=torch.uint8).scatter_add_(1, edges, torch.ones_like(edges, dtype=torch.uint8))
        for part in chunks:  # summed a chunk at a time, as binned
            squared_error += errors[part].sum()
            squared += squares[part].sum()
            cluster = marks[part, :bins].cumsum(1, dtype=torch.uint8).view(-1)
            indices[first_group + part.start : first_group + part.stop] = cluster[binned[part].view(-1)].view(-1, n)
    return indices.view(rows, cols), centroids, float(squared_error / squared.clamp(min=torch.finfo(torch.float64).tiny))


def _edges(centre: torch.Tensor, low: torch.Tensor, scale: torch.Tensor, bins: int) -> torch.Tensor:
    """The first bin of every cluster but the first: the bins whose centres lie past each midpoint of neighbours."""
    # Truncation, not floor(): values are non-negative here, and float64 floor is slow on small tensors with two threads.
    edges = ((centre[:, 1:] + centre[:, :-1]) * 0.5 - low).mul_(scale).add_(0.5).clamp_(0, bins).long()
    return torch.cummax(edges, 1).values  # an empty cluster keeps its centre, which may fall out of order


def _clusters(edges: torch.Tensor, counts: torch.Tensor, sums: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each cluster's number of values and their sum, from the running totals at its bins' ends."""
    g, bins = counts.shape[0], counts.shape[1] - 1
    ends = torch.cat([torch.zeros(g, 1, dtype=torch.long), edges, torch.full((g, 1), bins)], 1)
    count, total = counts.gather(1, ends), sums.gather(1, ends)
    return count[:, 1:] - count[:, :-1], total[:, 1:] - total[:, :-1]


def _means(edges: torch.Tensor, counts: torch.Tensor, sums: torch.Tensor, centre: torch.Tensor) -> torch.Tensor:
    """Each cluster's mean; an empty cluster keeps ``centre``."""
    members, total = _clusters(edges, counts, sums)
    return torch.where(members > 0, total / members.clamp(min=1), centre)
