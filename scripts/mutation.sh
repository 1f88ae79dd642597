#!/usr/bin/env bash
# Mutation testing of fastload's core modules with mutmut 3 (configured in pyproject.toml, [tool.mutmut]);
# how and when to run it, and the last scores: docs/testing.md.
#
#   scripts/mutation.sh [-j JOBS] [MODULE...]     MODULE: fastload/augment/draws.py, fastload/store/, ... (none: all below)
#   scripts/mutation.sh --list                    the modules and the tests each runs against
#
# Each module runs in its own copy of the tree, mutants/modules/<name>/ (mutmut then writes its mutants
# under that copy's mutants/), against only the fast tests that cover it (the map below), so a module takes
# minutes, not the hours of the whole suite per mutant. The copy is made fresh on every run: a concurrent
# edit of the work tree cannot reach a run in progress, and a result is never a cached verdict of older
# tests. It is kept afterwards, to read survivors:
#   cd mutants/modules/augment && ../../../.venv/bin/mutmut show NAME      (or: mutmut browse)
# The score per module is printed at the end (scripts/mutation_report.py): killed / (all - equivalent),
# equivalent mutants being those listed, with their reason, in scripts/mutation-equivalent.txt.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="$root/.venv/bin/python"
mutmut="$root/.venv/bin/mutmut"
jobs="${MUTATION_JOBS:-$(nproc)}"
# MUTATION_SKIP="tests/test_oracles_*": leave the map's entries matching these globs out (to measure the
# score without some tests, e.g. before they were written)
skip="${MUTATION_SKIP:-}"
# MUTATION_TIMEOUT_MULTIPLIER=15: mutmut's timeout_multiplier for this run (pyproject's otherwise). On a machine whose
# load average is several times its cores a mutant's tests can take longer than (their time + 15 s) x 5 of wall
# clock; mutmut then stops them and reports a timeout, or "segfault" (SIGKILL), that no test caused.
tmult="${MUTATION_TIMEOUT_MULTIPLIER:-}"
# MUTATION_SAMPLE='*__mutmut_*[37]': run only the mutants whose names match (fnmatch; this one: about one in five,
# spread over every function) and score those: a first estimate of a module in a fifth of the time
sample="${MUTATION_SAMPLE:-}"

# module -> the fast tests that cover it (files or node ids; no subprocess-only tests: a child process
# imports the unmutated package, so it can never kill a mutant).
declare -A TESTS=(
    [fastload/augment/draws.py]="tests/test_oracles_augment.py
        tests/test_oracles_augment2.py
        tests/test_loader.py::test_random_resized_crop_semantics
        tests/test_loader.py::test_random_resized_crop_fallback_for_extreme_shapes
        tests/test_loader.py::test_params_depend_only_on_seed_epoch_position
        tests/test_dropin2.py::test_random_erasing_follows_torchvisions_law
        tests/test_dropin2.py::test_random_erasing_is_a_function_of_seed_epoch_and_position
        tests/test_dropin2.py::test_jitter_order_and_factors_follow_torchvisions_law
        tests/test_dropin2.py::test_trivial_magnitude_bins_are_torchvisions
        tests/test_dropin2.py::test_trivial_draws_follow_torchvisions_law
        tests/test_dropin2.py::test_random_erasing_writes_only_its_rectangles_and_only_its_value
        tests/test_autoaugment.py::test_erasing_noise_is_standard_normal_where_it_erases_and_nowhere_else"
    [fastload/sampler.py]="tests/test_oracles_sampler.py::test_unshuffled_shares_are_distributed_samplers_batches
        tests/test_oracles_sampler.py::test_shuffled_shares_are_distributed_samplers_layout_of_the_epochs_permutation
        tests/test_oracles_sampler.py::test_without_padding_every_sample_is_read_by_exactly_one_rank
        tests/test_oracles_sampler.py::test_the_order_does_not_depend_on_the_world_or_the_batch_size
        tests/test_oracles_sampler.py::test_the_shuffle_puts_every_sample_at_every_position_equally_often
        tests/test_oracles_sampler.py::test_orders_of_neighbouring_epochs_and_seeds_are_independent
        tests/test_oracles_sampler.py::test_resume_table
        tests/test_oracles_sampler.py::test_merge_states_of_an_epoch_already_resumed_once_is_exactly_what_was_read
        tests/test_oracles_sampler.py::test_make_state_on_every_rank_at_the_same_step_is_the_same_state
        tests/test_oracles_sampler.py::test_interval_mask_and_intervals_of_are_inverse
        tests/test_oracles_sampler.py::test_block_size_for_is_the_most_records_whose_run_fits
        tests/test_oracles_sampler.py::test_block_order_of_no_samples_is_an_empty_int64_array
        tests/test_oracles_sampler.py::test_check_batch_bounds_and_its_message
        tests/test_oracles_sampler.py::test_resume_arguments_and_their_errors
        tests/test_oracles_sampler.py::test_num_batches_and_consumed_after_of_a_resumed_epoch_given_explicitly
        tests/test_oracles_sampler.py::test_intervals_of_reads_truthiness_not_values
        tests/test_oracles_sampler.py::test_check_intervals_refuses_what_is_not_sorted_disjoint_pairs_in_range
        tests/test_oracles_sampler.py::test_check_intervals_accepts_touching_and_whole_intervals
        tests/test_oracles_sampler.py::test_epoch_sampler_refuses_bad_arguments_naming_them
        tests/test_oracles_sampler.py::test_epoch_sampler_defaults_and_edges
        tests/test_oracles_sampler.py::test_indices_and_positions_are_int64_and_the_order_is_read_only
        tests/test_oracles_sampler.py::test_an_epoch_resumed_with_everything_consumed_reads_nothing
        tests/test_oracles_sampler.py::test_consumed_after_counts_each_ranks_own_first_batch
        tests/test_loader.py::test_sampler_batch_counts_and_shares
        tests/test_elastic.py::test_an_interrupted_epoch_resumed_on_another_world_reads_every_sample_once
        tests/test_elastic.py::test_a_fresh_epoch_keeps_the_distributed_sampler_layout
        tests/test_elastic.py::test_merge_states_of_ranks_at_different_batches_is_exact
        tests/test_scale.py::test_block_order_epochs_are_exact
        tests/test_scale.py::test_block_order_is_a_seeded_run_shuffle
        tests/test_scale.py::test_block_order_rank_shares_are_contiguous_stretches
        tests/test_scale.py::test_block_order_arguments
        tests/test_scale.py::test_block_order_function_and_block_size_for"
    [fastload/resume.py]="tests/test_oracles_resume.py
        tests/test_oracles_sampler.py
        tests/test_elastic.py::test_an_interrupted_epoch_resumed_on_another_world_reads_every_sample_once
        tests/test_elastic.py::test_merge_states_of_ranks_at_different_batches_is_exact
        tests/test_elastic.py::test_merge_states_refuses_states_of_different_loaders
        tests/test_elastic.py::test_version_1_states_load_on_the_same_world_and_are_refused_on_another
        tests/test_elastic.py::test_a_user_sampler_resumes_only_with_state_of_its_own
        tests/test_elastic.py::test_a_state_saved_at_the_end_of_an_epoch_resumes_at_the_next_on_any_world
        tests/test_hostile3_loader.py::test_merge_states_of_states_claiming_huge_epochs_is_a_config_error
        tests/test_hostile3_loader.py::test_merge_states_refuses_what_no_loader_saved
        tests/test_hostile3_loader.py::test_load_state_dict_with_out_of_range_intervals_is_a_config_error
        tests/test_loader.py::test_state_dict_resume_yields_exactly_the_rest
        tests/test_loader.py::test_load_state_dict_refuses_mismatch"
    [fastload/dlcompat.py]="tests/test_oracles_dlcompat.py tests/test_dropin.py tests/test_oracles_sampler.py"
    [fastload/transforms.py]="tests/test_oracles_transforms.py tests/test_oracles_transforms2.py tests/test_transforms.py tests/test_autoaugment.py tests/test_chain_augment.py"
    [fastload/tvkinds.py]="tests/test_oracles_transforms.py tests/test_oracles_transforms2.py tests/test_transforms.py tests/test_autoaugment.py tests/test_chain_augment.py"
    [fastload/host.py]="tests/test_oracles_host.py tests/test_host.py"
    [fastload/cache.py]="tests/test_oracles_cache.py tests/test_oracles_cache2.py tests/test_oracles_cache3.py tests/test_cache.py tests/test_cache_fidelity.py"
    [fastload/reader.py]="tests/test_oracles_reader.py tests/test_oracles_reader2.py tests/test_oracles_labels.py tests/test_reader.py tests/test_hostile_read.py tests/test_fields.py tests/test_oracles_reader3.py"
    [fastload/store/]="tests/test_oracles_btree.py tests/test_oracles_store.py tests/test_format.py tests/test_hostile_read.py
        tests/test_truncated_checks.py
        tests/test_oracles_reader.py::test_read_batch_across_shard_boundaries_reads_each_records_own_pixels
        tests/test_reader.py::test_random_access_and_index_rules"
    [fastload/packing/images.py]="tests/test_oracles_images.py tests/test_oracles_images2.py tests/test_oracles_images3.py tests/test_oracles_images4.py tests/test_oracles_fastfile.py tests/test_pack_pixels.py tests/test_big_images.py tests/test_input_pack.py tests/test_cache_fidelity.py"
    [fastload/packing/sources.py]="tests/test_oracles_sources.py tests/test_sources.py tests/test_input_pack.py"
    [fastload/profile.py]="tests/test_oracles_profile.py tests/test_profile.py"
    [fastload/bench/report.py]="tests/test_oracles_report.py"
)
ALL=(fastload/augment/draws.py fastload/sampler.py fastload/resume.py fastload/dlcompat.py fastload/transforms.py
     fastload/tvkinds.py fastload/host.py fastload/cache.py fastload/reader.py fastload/store/ fastload/packing/images.py
     fastload/packing/sources.py fastload/profile.py fastload/bench/report.py)

mods=()
while [ $# -gt 0 ]; do
    case "$1" in
        -j) jobs="$2"; shift 2 ;;
        --list) for m in "${ALL[@]}"; do echo "$m:" ${TESTS[$m]}; done; exit 0 ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) mods+=("$1"); shift ;;
    esac
done
[ ${#mods[@]} -gt 0 ] || mods=("${ALL[@]}")
for m in "${mods[@]}"; do
    [ -n "${TESTS[$m]+x}" ] || { echo "mutation.sh: no test map for $m (one of: ${ALL[*]})" >&2; exit 2; }
done
[ -x "$mutmut" ] || { echo "mutation.sh: $mutmut missing: run scripts/setup.sh (mutmut is in the dev extra)" >&2; exit 2; }

summary="$root/mutants/modules/summary-$(date -u +%Y%m%dT%H%M%SZ).txt"
mkdir -p "$root/mutants/modules"
for m in "${mods[@]}"; do
    name="$(echo "${m#fastload/}" | sed 's#/$##; s#\.py$##; s#/#-#g')"
    work="$root/mutants/modules/$name"
    echo "== $m -> $work (tests: $(echo ${TESTS[$m]} | wc -w) files or ids)"
    rm -rf "$work"
    mkdir -p "$work"
    # the tree as it is now: tracked files and new ones git does not ignore (no venv, no data, no mutants)
    # (a tracked file deleted in the work tree is skipped, not an error)
    git ls-files -z -co --exclude-standard | tar -c --null --ignore-failed-read -T - -f - 2>/dev/null \
        | tar -x -C "$work" -f -
    [ -f "$work/$(echo "$m" | sed 's#/$#/__init__.py#')" ] || { echo "mutation.sh: copying the tree to $work failed" >&2; exit 1; }
    sel=()
    for t in ${TESTS[$m]}; do
        keep=1
        for g in $skip; do
            # shellcheck disable=SC2053
            [[ "$t" == $g ]] && keep=0
        done
        [ $keep = 1 ] && sel+=("$t")
    done
    "$py" scripts/mutation_report.py config pyproject.toml "$m" "${sel[@]}" > "$work/pyproject.toml"
    [ -z "$tmult" ] || sed -i "s/^timeout_multiplier = .*/timeout_multiplier = $tmult/" "$work/pyproject.toml"
    start=$(date +%s)
    ( cd "$work" && OMP_NUM_THREADS=1 "$mutmut" run --max-children "$jobs" ${sample:+"$sample"} > mutmut.log 2>&1 ) \
        || echo "   mutmut exited $? (see $work/mutmut.log)"
    echo "   $(( $(date +%s) - start )) s"
    "$py" scripts/mutation_report.py score "$work" "$m" scripts/mutation-equivalent.txt ${sample:+--sample} | tee -a "$summary"
done
echo "summary: $summary"
