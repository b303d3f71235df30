"""Course assignments built on this project: strip functions for students, grade their copies.

    python -m assignments make --assignment rejection_sampling --out DIR      # the student's copy
    python -m assignments grade DIR [--json]                                  # the instructor's grade
    python -m assignments check                      # the student, inside their copy: visible checks
    python -m assignments export gradescope rejection_sampling --out hw.zip
    python -m assignments export github rejection_sampling --out DIR
    python -m assignments grade rejection_sampling --submissions DIR --csv grades.csv  # a class

Each ready-made assignment is a folder here (assignments/<name>/: README.md, instructor.md and
__init__.py defining ASSIGNMENT: its functions, checks, points); registry.py lists them.
docs/instructor_guide.md is the instructor's guide. The modules:

    definition.py  what an assignment and a check are        make.py     the copy, the leak check
    registry.py    the ready-made ones, custom ones           grade.py    grading, reports
    references.py  inputs, reference values, checkpoints      export.py   Gradescope, GitHub
    memory.py      memory limits, out-of-memory verdicts      batch.py    a class's submissions, one CSV
    probing.py     helpers the checks share                   runner.py, zygote.py  a check's process
    sandbox.py     the sandbox user, namespaces, killing every process of a check, fresh keyrings and tmpfs
    submission_files.py  a submission's files, never links    printable.py  escaping what students' code wrote
    upstream.py    how much of a submission is the reference solution
"""
