"""Parsers for every sample format the store ingests.

Each parser turns the bytes of one file into canonical frames (one per store
table) plus what was rejected, row by row, with the reason. Parsers never touch
the database: `store.py` owns transactions, idempotency and de-duplication.

Formats (the `kind` of a file, recorded in `batches.kind`):
  paper_operator      `<GPU>_<op>_fp16.csv` from DebarghaG/estimate-train-time (one row per pass)
  paper_optimizer     `<GPU>_{first,middle,last}Stage_optimizer_fp16.csv` and `<GPU>_optimizer_fp16.csv`
  paper_nccl          `<GPU>_<collective>_fp16[_<nodes>_<gpus_per_node>].csv`
  paper_summary       `<GPU>.csv`: the paper's chosen regressor and its error (`Best_error%`)
  vtrain              VIA-Research/vTrain `ground_truth_single.csv` (measured iteration times)
  op_samples          the project's own schema: the op_samples columns minus batch_id
  collective_samples  the collective_samples columns minus batch_id
  measured_runs       `case_id,platform,arch,...,step_time_s` (+ optional source, attention, framework,
                      source_id, notes)
  published_runs      ../shared/datasets/published-runs/*.csv (one row a published multi-node run);
                      how each source's rows become measured runs is defined, with citations, in
                      `predictor/catalog/published_sources.json`

Whole files are rejected (`FormatError`, naming the file and the problem) when they are empty,
hold a header but no rows, are not UTF-8, lack a required column, hold nested values (a Parquet
column of lists), or (named explicitly) match no known layout.

Rows are rejected one by one, with the line number and a reason that is counted:
  * a CSV row with more or fewer fields than the header;
  * values that do not parse or are out of range: a NaN / inf duration ("not finite"), a zero or
    negative one ("not positive"), a non-integer or non-positive shape, an unknown op / pass /
    collective, ...;
  * a truncated last line. What is detectable: a CSV that does not end with a newline has an
    unterminated last line; it is rejected when it has fewer fields than the header, when a value
    does not parse, or when its last field is written unlike that column in every other row
    (shorter than all of them, or in another numeric notation: `4.22835` where the other rows
    read `4.1e-05`). A cut that leaves a value written like its neighbours (`0.00123` cut to
    `0.0012` among 4-5 digit values) cannot be told from a complete line and is kept.
Outliers that are valid numbers (the paper's 5.4e7 us optimizer rows, bimodal allgather rows) are
kept on purpose. Measured runs that lack a field the predictor needs are *skipped* (counted with
the reason, e.g. "precision not stated"), never filled with a guess; rows that contradict themselves
(tp*pp*dp != num_gpus, GradAccum != global_batch / (micro_batch * dp), ...) are *rejected*.

One module a format (paper, vtrain, project, published), what they share (common), the published
sources (sources), and which file is read as what (files)."""
