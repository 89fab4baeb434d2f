# Sourced by demo/run.sh: sample the outbox while the live chain runs and
# draw what happened with gnuplot.
#
#   demo_sampler_start DSN FILE   sample every 0.1 s into FILE, in the background
#   demo_event LABEL              mark the current time with LABEL (e.g. a kill)
#   demo_sampler_stop             stop the sampler
#   demo_plot FILE PNG            draw the samples and events into PNG
#
# A sample is one line: Unix time, then the outbox.stats counters enqueued,
# claimed, taken_over, acked, the number of receipts, the commands not
# published (pending and sending, from outbox.metrics_backlog()) and the
# age in seconds of the oldest ready command.  The sampler is one psql
# session running the query under \watch; it is stopped by its pid.

DEMO_SAMPLER_PID=
DEMO_EVENTS=

demo_sampler_start() {
	local dsn=$1 file=$2
	DEMO_EVENTS="$file.events"
	: >"$DEMO_EVENTS"
	"$PGBIN/psql" -X -qAt -F ' ' -d "$dsn" >"$file" 2>"$file.err" <<'EOS' &
SELECT pg_catalog.to_char(pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()), 'FM9999999999.000'),
       s.enqueued, s.claimed, s.taken_over, s.acked,
       (SELECT pg_catalog.count(*) FROM outbox.receipts),
       (SELECT COALESCE(pg_catalog.sum(b.commands), 0) FROM outbox.metrics_backlog() b
         WHERE b.status IN ('pending', 'sending')),
       (SELECT COALESCE(pg_catalog.max(b.oldest_age_seconds), 0) FROM outbox.metrics_backlog() b
         WHERE b.state = 'ready')
  FROM outbox.stats s
\watch 0.1
EOS
	DEMO_SAMPLER_PID=$!
}

demo_event() {
	[ -n "$DEMO_EVENTS" ] && printf '%s %s\n' "$(date +%s.%N)" "$1" >>"$DEMO_EVENTS"
}

demo_sampler_stop() {
	if [ -n "$DEMO_SAMPLER_PID" ]; then
		kill "$DEMO_SAMPLER_PID" 2>/dev/null
		wait "$DEMO_SAMPLER_PID" 2>/dev/null
		DEMO_SAMPLER_PID=
	fi
}

# Rates per second over a 1 s window, times relative to the first sample:
# t decided claimed acked completed backlog oldest_age
demo_rates() {
	awk 'NF == 8 && $1 ~ /^[0-9.]+$/ {
			n++; t[n] = $1; e[n] = $2; c[n] = $3; a[n] = $5; r[n] = $6; b[n] = $7; o[n] = $8 }
		END {
			for (i = 1; i <= n; i++) {
				j = i; while (j > 1 && t[i] - t[j - 1] <= 1.0) j--;
				dt = t[i] - t[j];
				if (dt <= 0) { de = dc = da = dr = 0 }
				else { de = (e[i] - e[j]) / dt; dc = (c[i] - c[j]) / dt;
					   da = (a[i] - a[j]) / dt; dr = (r[i] - r[j]) / dt }
				printf "%.3f %.1f %.1f %.1f %.1f %d %.2f\n", t[i] - t[1], de, dc, da, dr, b[i], o[i]
			}
		}' "$1"
}

demo_plot() {
	local samples=$1 png=$2 t0 rates events arrows="" first_takeover
	rates="$samples.rates"
	demo_rates "$samples" >"$rates"
	[ -s "$rates" ] || { echo "   no samples to plot" >&2; return 1; }
	t0=$(awk 'NF == 8 && $1 ~ /^[0-9.]+$/ { print $1; exit }' "$samples")
	# the events, and the first sample where a lease was taken over
	events=$(awk -v t0="$t0" '{ t = $1; sub(/^[^ ]+ /, ""); printf "%.3f %s\n", t - t0, $0 }' "$DEMO_EVENTS")
	first_takeover=$(awk -v t0="$t0" 'NF == 8 && $1 ~ /^[0-9.]+$/ {
			if (n++ == 0) base = $4; else if ($4 > base) { printf "%.3f", $1 - t0; exit } }' "$samples")
	[ -n "$first_takeover" ] && events=$(printf '%s\n%s takeover' "$events" "$first_takeover")
	while read -r t label; do
		[ -n "$t" ] || continue
		arrows="$arrows
set arrow from $t, graph 0 to $t, graph 1 nohead dt 2 lw 1.5 lc rgb '#aa0000' front
set label '$label' at $t, graph 0.96 offset 0.5,0 tc rgb '#aa0000' front"
	done <<<"$events"
	gnuplot <<EOG
set terminal pngcairo size 1200,900 font 'sans,11'
set output '$png'
set multiplot layout 2,1 title 'outbox demo, step 9: 4 producers, relay-A and relay-B, a webhook consumer (5 ms per command)' font 'sans,13'
set grid
set key inside right center box opaque
set lmargin 10
set rmargin 10
set xrange [0:*]
set xlabel 'seconds since the relays started'
set ylabel 'commands per second (log scale)'
set logscale y
set yrange [10:*]
set title 'decided, claimed, acked and completed per second (1 s window)'
$arrows
plot '$rates' using 1:2 with lines lw 2 title 'decided', \
     '' using 1:3 with lines lw 2 title 'claimed', \
     '' using 1:4 with lines lw 2 title 'acked', \
     '' using 1:5 with lines lw 2 title 'completed'
set title 'backlog (pending + sending) and the age of the oldest ready command'
unset logscale y
set yrange [0:*]
set y2range [0:*]
set key inside right top box opaque
set ylabel 'commands'
set y2label 'seconds'
set y2tics
set ytics nomirror
plot '$rates' using 1:6 with lines lw 2 title 'backlog', \
     '' using 1:7 axes x1y2 with lines lw 2 title 'oldest ready age (s)'
unset multiplot
EOG
}
