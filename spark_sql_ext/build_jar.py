"""Build the catalog's jar: ``python -m spark_sql_ext.build_jar`` (what ``make spark-jar``
runs). Compiles ``spark_sql_ext/java`` against the installed pyspark's jars for Java 17
into ``spark_sql_ext/jars/topicbase-spark.jar``; does nothing when the jar is newer than
every source file."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = os.path.join(HERE, "java")
JAR = os.path.join(HERE, "jars", "topicbase-spark.jar")


def build(force: bool = False) -> str:
    import pyspark

    sources = glob.glob(os.path.join(SOURCES, "**", "*.java"), recursive=True)
    newest = max(os.path.getmtime(s) for s in sources)
    if not force and os.path.exists(JAR) and os.path.getmtime(JAR) >= newest:
        return JAR
    for tool in ("javac", "jar"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"{tool} is missing: install openjdk-17-jdk-headless")
    classpath = os.path.join(os.path.dirname(pyspark.__file__), "jars", "*")
    os.makedirs(os.path.dirname(JAR), exist_ok=True)
    with tempfile.TemporaryDirectory() as classes:
        subprocess.run(["javac", "--release", "17", "-nowarn", "-cp", classpath, "-d", classes,
                        *sources], check=True)  # fmt: skip
        partial = JAR + ".part"
        subprocess.run(["jar", "cf", partial, "-C", classes, "."], check=True)
        os.replace(partial, JAR)
    return JAR


if __name__ == "__main__":
    print(build(force="--force" in sys.argv[1:]))
