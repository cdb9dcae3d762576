#!/usr/bin/env python3
"""Table 3 peer: PyFlink SQL, parallelism 1, 1-minute tumbling event-time
windows per device with 5 s bounded out-of-orderness, on the CSV the
generator wrote (arrival order). Prints the number of window results."""
import os
import sys

from pyflink.table import EnvironmentSettings, TableEnvironment

src, out = sys.argv[1], sys.argv[2]
env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
conf = env.get_config()
conf.set("parallelism.default", "1")
# The filesystem sink commits its files on checkpoints (and a final one at the end).
conf.set("execution.checkpointing.interval", "10 s")
conf.set("table.exec.source.idle-timeout", "0 ms")
env.execute_sql(f"""
CREATE TABLE readings (
  device STRING, ts BIGINT, temp DOUBLE,
  rowtime AS TO_TIMESTAMP_LTZ(ts, 3),
  WATERMARK FOR rowtime AS rowtime - INTERVAL '5' SECOND
) WITH ('connector' = 'filesystem', 'path' = '{src}', 'format' = 'csv')""")
env.execute_sql(f"""
CREATE TABLE results (
  device STRING, window_start TIMESTAMP_LTZ(3), window_end TIMESTAMP_LTZ(3),
  n BIGINT, tmin DOUBLE, tmax DOUBLE, tavg DOUBLE
) WITH ('connector' = 'filesystem', 'path' = '{out}', 'format' = 'csv')""")
env.execute_sql("""
INSERT INTO results
SELECT device, window_start, window_end, COUNT(*), MIN(temp), MAX(temp), AVG(temp)
FROM TABLE(TUMBLE(TABLE readings, DESCRIPTOR(rowtime), INTERVAL '1' MINUTE))
GROUP BY device, window_start, window_end""").wait()

rows = events = 0
for root, _, files in os.walk(out):
    for f in files:
        with open(os.path.join(root, f)) as fh:
            for line in fh:
                rows += 1
                events += int(line.split(",")[3])
print(f"windows={rows} events={events}")
