"""``specd bench``: workloads, baselines measured in the same run, and the report.

- :mod:`~specd.bench.workloads` builds the prompts (editor, humaneval, edit, random);
- :mod:`~specd.bench.configs` names the configurations (Hugging Face baselines, specd);
- :mod:`~specd.bench.runners` runs one configuration on one prompt and times it;
- :mod:`~specd.bench.harness` interleaves them and adds the floor, prefix-cache and RSS checks;
- :mod:`~specd.bench.report` turns runs into the report's per-configuration results;
- :mod:`~specd.bench.targets` checks the results against the targets;
- :mod:`~specd.bench.render` draws the report as a markdown table and plots.
"""
