//! How a product splits into tasks across threads: a grid of row tasks by column tasks, over
//! units of whole register tiles (rows) and panel groups (columns).
//!
//! Two things decide it. Balance first: every thread should get the same number of units, since
//! the call lasts as long as its largest task (resnet50's 7x7 layers have 9 row tiles, which as
//! 4 row tasks are 3, 3, 3 and none: one of two threads did two thirds of the work). Then the
//! bytes the tasks read: each row task reads all of its columns' weights, and each column task
//! all of its rows' inputs, so a product whose weights outweigh its inputs (a batch-1 layer)
//! splits its columns, and one whose inputs outweigh its weights its rows.

/// `(row tasks, column tasks)` for `rows` row units and `cols` column units on `threads`
/// threads: `2 · threads` tasks where there are enough units (each thread two, so that one that
/// finishes early can take over from one that lost its core), as evenly sized as the units
/// allow, and of those the split that reads the fewest bytes, where the rows' inputs are
/// `row_bytes` and the columns' weights `col_bytes` in all.
pub(crate) fn grid(
    threads: usize,
    rows: usize,
    cols: usize,
    row_bytes: usize,
    col_bytes: usize,
) -> (usize, usize) {
    if threads <= 1 || rows * cols <= 1 {
        return (1, 1);
    }
    let units = rows * cols;
    let mut best = (1, 1);
    let mut best_key = (usize::MAX, usize::MAX, usize::MAX);
    for (fewer, tasks) in [2 * threads, threads].into_iter().enumerate() {
        for rt in (1..=tasks.min(rows)).filter(|rt| tasks % rt == 0) {
            let ct = tasks / rt;
            if ct > cols {
                continue;
            }
            // The busiest thread's units when the tasks are dealt out evenly: tasks are
            // rt × ct of at most this many units each.
            let largest = rows.div_ceil(rt) * cols.div_ceil(ct);
            let per_thread = largest * tasks.div_ceil(threads);
            // Balance in whole percent of the ideal; between splits that are equally even, two
            // tasks a thread before one, then the fewest bytes.
            let waste = per_thread * threads * 100 / units;
            let bytes = row_bytes.saturating_mul(ct) + col_bytes.saturating_mul(rt);
            if (waste, fewer, bytes) < best_key {
                best_key = (waste, fewer, bytes);
                best = (rt, ct);
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::grid;

    #[test]
    fn one_thread_or_one_unit_is_one_task() {
        assert_eq!(grid(1, 100, 100, 1, 1), (1, 1));
        assert_eq!(grid(4, 1, 1, 1, 1), (1, 1));
    }

    #[test]
    fn rows_that_do_not_divide_evenly_split_the_columns() {
        // resnet50's 7x7 layers: 9 row tiles, 8 groups of 512 channels, weights far larger
        // than the image.
        assert_eq!(grid(2, 9, 8, 49 * 512 * 4, 512 * 512 * 9 * 4), (1, 4));
    }

    #[test]
    fn the_larger_operand_is_the_one_not_read_twice() {
        // Weights larger than the inputs: columns.
        assert_eq!(grid(2, 64, 64, 1 << 10, 1 << 20), (1, 4));
        // Inputs larger than the weights: rows.
        assert_eq!(grid(2, 64, 64, 1 << 20, 1 << 10), (4, 1));
    }

    #[test]
    fn every_task_is_within_its_units() {
        for threads in 1..6 {
            for rows in 1..20 {
                for cols in 1..20 {
                    let (rt, ct) = grid(threads, rows, cols, 100, 100);
                    assert!(rt >= 1 && rt <= rows && ct >= 1 && ct <= cols);
                    assert!(rt * ct <= 2 * threads);
                }
            }
        }
    }

    #[test]
    fn a_single_row_splits_its_columns() {
        assert_eq!(grid(2, 1, 12, 3072, 1 << 22), (1, 4));
        assert_eq!(grid(2, 1, 3, 3072, 1 << 22).0, 1);
    }
}
