package io.topicbase.spark;

import java.io.Serializable;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.TreeSet;

import org.apache.spark.sql.sources.EqualTo;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.sources.GreaterThan;
import org.apache.spark.sql.sources.GreaterThanOrEqual;
import org.apache.spark.sql.sources.In;
import org.apache.spark.sql.sources.LessThan;
import org.apache.spark.sql.sources.LessThanOrEqual;

/**
 * What a wire scan's filters say about the rows it needs: the partitions ({@code partition
 * = v}, {@code partition IN (...)}) and an offset interval ({@code offset} compared with a
 * constant), used to cut fewer and shorter ranges.
 *
 * <p>Invariant: only narrows, never drops a row that satisfies every filter; Spark still
 * evaluates all the filters on what is read (they are not reported as fully handled), so
 * a filter this class does not understand is simply not used here.
 */
final class WireBounds implements Serializable {
    private static final long serialVersionUID = 1L;
    /** null: every partition. */
    private Set<Integer> partitions;
    private long fromOffset = 0;
    private long toOffset = Long.MAX_VALUE; // exclusive
    private final List<Filter> used = new ArrayList<>();

    /** The bounds of {@code filters} (the top-level conjuncts Spark pushes). */
    static WireBounds of(Filter[] filters) {
        WireBounds bounds = new WireBounds();
        for (Filter filter : filters) {
            if (bounds.take(filter)) {
                bounds.used.add(filter);
            }
        }
        return bounds;
    }

    private static Long whole(Object value) {
        if (value instanceof Integer || value instanceof Long || value instanceof Short
                || value instanceof Byte) {
            return ((Number) value).longValue();
        }
        return null;
    }

    private void keepPartitions(Set<Integer> allowed) {
        if (partitions == null) {
            partitions = new TreeSet<>(allowed);
        } else {
            partitions.retainAll(allowed);
        }
    }

    private boolean take(Filter filter) {
        if (filter instanceof EqualTo && ((EqualTo) filter).attribute().equals("partition")) {
            Long v = whole(((EqualTo) filter).value());
            if (v == null) {
                return false;
            }
            Set<Integer> one = new TreeSet<>();
            if (v >= Integer.MIN_VALUE && v <= Integer.MAX_VALUE) {
                one.add(v.intValue());
            }
            keepPartitions(one);
            return true;
        }
        if (filter instanceof In && ((In) filter).attribute().equals("partition")) {
            Set<Integer> some = new TreeSet<>();
            for (Object value : ((In) filter).values()) {
                Long v = whole(value);
                if (v == null && value != null) {
                    return false; // not a whole number: not understood, not used
                }
                if (v != null && v >= Integer.MIN_VALUE && v <= Integer.MAX_VALUE) {
                    some.add(v.intValue());
                }
            }
            keepPartitions(some);
            return true;
        }
        String attribute;
        Long v;
        if (filter instanceof EqualTo) {
            attribute = ((EqualTo) filter).attribute();
            v = whole(((EqualTo) filter).value());
            if (attribute.equals("offset") && v != null) {
                fromOffset = Math.max(fromOffset, v);
                toOffset = Math.min(toOffset, v == Long.MAX_VALUE ? v : v + 1);
                return true;
            }
        } else if (filter instanceof GreaterThan) {
            attribute = ((GreaterThan) filter).attribute();
            v = whole(((GreaterThan) filter).value());
            if (attribute.equals("offset") && v != null) {
                fromOffset = Math.max(fromOffset, v == Long.MAX_VALUE ? v : v + 1);
                toOffset = v == Long.MAX_VALUE ? 0 : toOffset;
                return true;
            }
        } else if (filter instanceof GreaterThanOrEqual) {
            attribute = ((GreaterThanOrEqual) filter).attribute();
            v = whole(((GreaterThanOrEqual) filter).value());
            if (attribute.equals("offset") && v != null) {
                fromOffset = Math.max(fromOffset, v);
                return true;
            }
        } else if (filter instanceof LessThan) {
            attribute = ((LessThan) filter).attribute();
            v = whole(((LessThan) filter).value());
            if (attribute.equals("offset") && v != null) {
                toOffset = Math.min(toOffset, v);
                return true;
            }
        } else if (filter instanceof LessThanOrEqual) {
            attribute = ((LessThanOrEqual) filter).attribute();
            v = whole(((LessThanOrEqual) filter).value());
            if (attribute.equals("offset") && v != null) {
                toOffset = Math.min(toOffset, v == Long.MAX_VALUE ? v : v + 1);
                return true;
            }
        }
        return false;
    }

    /** The filters that narrowed the bounds (for Spark's plan: pushed, still evaluated). */
    Filter[] used() {
        return used.toArray(new Filter[0]);
    }

    boolean wants(int partition) {
        return partitions == null || partitions.contains(partition);
    }

    /** [start, end) of a partition's readable [start, end) that the filters can match. */
    long from(long start) {
        return Math.max(start, fromOffset);
    }

    long to(long end) {
        return Math.min(end, toOffset);
    }

    @Override
    public String toString() {
        return (partitions == null ? "" : "partitions=" + partitions + ", ")
            + (fromOffset == 0 && toOffset == Long.MAX_VALUE ? ""
                : "offsets=[" + fromOffset + ", " + (toOffset == Long.MAX_VALUE ? "end"
                    : String.valueOf(toOffset)) + "), ");
    }
}
