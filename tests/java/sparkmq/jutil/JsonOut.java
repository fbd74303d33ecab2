package sparkmq.jutil;

import java.io.BufferedOutputStream;
import java.io.FileOutputStream;
import java.io.FileDescriptor;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.Collection;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * JSON lines on stdout: one object per event, written whole and flushed, from any thread.
 *
 * <p>Standard output is reopened on file descriptor 1 and {@link System#out} is pointed at stderr, so a library
 * that prints (RocketMQ's clients print a few lines at start) can never interleave with the events.
 */
public final class JsonOut {
    private static final PrintStream OUT = new PrintStream(
            new BufferedOutputStream(new FileOutputStream(FileDescriptor.out), 1 << 16), false, StandardCharsets.UTF_8);

    static {
        System.setOut(System.err);
    }

    private JsonOut() {
    }

    /** An ordered map to fill with an event's fields: {@code JsonOut.event("sent").put(...)}. */
    public static Map<String, Object> event(String kind) {
        Map<String, Object> fields = new LinkedHashMap<>();
        fields.put("event", kind);
        return fields;
    }

    /** Writes one event line and flushes it. */
    public static void emit(Map<String, Object> fields) {
        String line = encode(fields);
        synchronized (OUT) {
            OUT.print(line);
            OUT.print('\n');
            OUT.flush();
        }
    }

    /** An error event: the operation, the exception's class and message (and its cause's). */
    public static void error(String op, Throwable error, Map<String, Object> extra) {
        Map<String, Object> fields = event("error");
        fields.put("op", op);
        fields.put("class", error.getClass().getName());
        fields.put("message", String.valueOf(error.getMessage()));
        if (error.getCause() != null) {
            fields.put("cause", error.getCause().getClass().getName() + ": " + error.getCause().getMessage());
        }
        if (extra != null) {
            fields.putAll(extra);
        }
        emit(fields);
    }

    /** JSON text of a value: maps, collections, arrays of strings, strings, numbers, booleans and null. */
    public static String encode(Object value) {
        StringBuilder sb = new StringBuilder(128);
        write(sb, value);
        return sb.toString();
    }

    private static void write(StringBuilder sb, Object value) {
        if (value == null) {
            sb.append("null");
        } else if (value instanceof String) {
            quote(sb, (String) value);
        } else if (value instanceof Double || value instanceof Float) {
            double d = ((Number) value).doubleValue();
            if (Double.isNaN(d) || Double.isInfinite(d)) {
                sb.append("null");
            } else {
                sb.append(d);
            }
        } else if (value instanceof Number || value instanceof Boolean) {
            sb.append(value);
        } else if (value instanceof Map) {
            sb.append('{');
            boolean first = true;
            for (Map.Entry<?, ?> e : ((Map<?, ?>) value).entrySet()) {
                if (!first) {
                    sb.append(',');
                }
                first = false;
                quote(sb, String.valueOf(e.getKey()));
                sb.append(':');
                write(sb, e.getValue());
            }
            sb.append('}');
        } else if (value instanceof Collection) {
            sb.append('[');
            boolean first = true;
            for (Object item : (Collection<?>) value) {
                if (!first) {
                    sb.append(',');
                }
                first = false;
                write(sb, item);
            }
            sb.append(']');
        } else if (value instanceof long[]) {
            sb.append('[');
            long[] items = (long[]) value;
            for (int i = 0; i < items.length; i++) {
                if (i > 0) {
                    sb.append(',');
                }
                sb.append(items[i]);
            }
            sb.append(']');
        } else {
            quote(sb, value.toString());
        }
    }

    private static void quote(StringBuilder sb, String s) {
        sb.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"': sb.append("\\\""); break;
                case '\\': sb.append("\\\\"); break;
                case '\n': sb.append("\\n"); break;
                case '\r': sb.append("\\r"); break;
                case '\t': sb.append("\\t"); break;
                default:
                    if (c < 0x20) {
                        sb.append(String.format("\\u%04x", (int) c));
                    } else {
                        sb.append(c);
                    }
            }
        }
        sb.append('"');
    }
}
