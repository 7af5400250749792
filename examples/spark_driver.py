"""`evamed` as a spark-submit application: the same commands, on the session spark-submit gives.

    spark-submit --master spark://host:7077 --conf spark.sql.shuffle.partitions=8 \
        examples/spark_driver.py compose --once --profiles p.eva --spool /shared/spool \
        --out /shared/out --checkpoint /shared/ckpt

Any `evamed` command runs (`compose`, `replay --engine spark`, ...); its session takes
spark-submit's `--master` and `--conf` settings over its own defaults (spark_jobs/session.py),
so the command's `--master` is not needed. The driver and the executors import the `evamed`
package: set PYSPARK_PYTHON to an interpreter that has it (docs/spark.md, "On a cluster").
"""

from mediator.cli import app

if __name__ == "__main__":
    app(prog_name="evamed")
