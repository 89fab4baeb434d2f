#!/usr/bin/perl
# Check a META.json against the PGXN Meta Spec 1.0 (https://pgxn.org/meta/spec.txt):
# the required keys, the type and form of every key the spec defines, no
# unknown keys (other than x_ ones), and, given the control file, that the
# versions agree with its default_version.
#
#   perl test/pgxn-meta.pl META.json [outbox.control]
#
# Prints one "ok"/"not ok" line per check and exits non-zero on any failure.
use strict;
use warnings;
use JSON::PP;

my ($file, $control) = @ARGV;
die "usage: $0 META.json [EXTENSION.control]\n" unless defined $file;

my $n = 0;
my $failed = 0;
sub check($$;$)
{
	my ($ok, $name, $why) = @_;
	$n++;
	print(($ok ? 'ok' : 'not ok') . " $n - $name" . ($ok || !defined $why ? '' : " ($why)") . "\n");
	$failed++ unless $ok;
	return $ok;
}

my $text = do { local $/; open(my $fh, '<', $file) or die "$file: $!\n"; <$fh> };
my $meta = eval { JSON::PP->new->utf8->decode($text) };
check(ref $meta eq 'HASH', 'META.json is a JSON object', $@ || 'not an object') or exit 1;

my $semver = qr/^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$/;
my $term = qr/^[^\/\\\s[:cntrl:]]{2,}$/;
my %licenses = map { $_ => 1 } qw(agpl_3 apache_1_1 apache_2_0 artistic_1 artistic_2
  bsd freebsd gfdl_1_2 gfdl_1_3 gpl_1 gpl_2 gpl_3 lgpl_2_1 lgpl_3_0 mit
  mozilla_1_0 mozilla_1_1 openssl perl_5 postgresql qpl_1_0 ssleay sun zlib
  open_source restricted unrestricted unknown);

sub is_string { my $v = shift; return defined $v && !ref $v && length $v > 0; }
sub is_path { my $v = shift; return is_string($v) && $v !~ m{^/} && $v !~ m{\\} && $v !~ m{(^|/)\.\.(/|$)}; }
sub custom { return $_[0] =~ /^[xX]_./; }
sub only_keys
{
	my ($h, @known) = @_;
	my %k = map { $_ => 1 } @known;
	my @bad = grep { !$k{$_} && !custom($_) } sort keys %$h;
	return @bad ? "unknown keys: @bad" : undef;
}
sub version_range
{
	my $v = shift;
	return 1 if defined $v && !ref $v && $v eq '0';
	return 0 unless is_string($v);
	for my $part (split /\s*,\s*/, $v)
	{
		my $ver = $part =~ s/^(?:==|!=|>=|<=|>|<)\s*//r;
		return 0 unless $ver =~ $semver || $ver eq '0';
	}
	return 1;
}

# Required keys.
for my $k (qw(name version abstract maintainer license provides meta-spec))
{
	check(exists $meta->{$k}, "required key \"$k\" present");
}
check(!defined only_keys($meta, qw(name version abstract maintainer license provides
	meta-spec description generated_by tags no_index prereqs release_status resources)),
	'no keys outside the spec', only_keys($meta, qw(name version abstract maintainer license
	provides meta-spec description generated_by tags no_index prereqs release_status resources)));

check(is_string($meta->{name}) && $meta->{name} =~ $term, 'name is a term', $meta->{name});
check(is_string($meta->{version}) && $meta->{version} =~ $semver, 'version is a semantic version', $meta->{version});
check(is_string($meta->{abstract}), 'abstract is a non-empty string');

my $m = $meta->{maintainer};
check((is_string($m) || (ref $m eq 'ARRAY' && @$m && !grep { !is_string($_) } @$m)),
	'maintainer is a string or a list of strings');

my $l = $meta->{license};
check((!ref $l && defined $l && $licenses{$l})
	  || (ref $l eq 'ARRAY' && @$l && !grep { ref $_ || !$licenses{$_} } @$l)
	  || (ref $l eq 'HASH' && %$l && !grep { !is_string($_) || !m{^[a-z][a-z0-9+.-]*://}i } values %$l),
	'license is a known license string, a list of them, or names mapped to URLs');

my $p = $meta->{provides};
if (check(ref $p eq 'HASH' && %$p, 'provides is a non-empty object'))
{
	for my $ext (sort keys %$p)
	{
		my $e = $p->{$ext};
		check($ext =~ $term, "provides: \"$ext\" is a term");
		next unless check(ref $e eq 'HASH', "provides.$ext is an object");
		check(is_path($e->{file}), "provides.$ext.file is a relative path", $e->{file});
		check(defined $e->{file} && -e $e->{file}, "provides.$ext.file exists", $e->{file}) if defined $e->{file};
		check(is_string($e->{version}) && $e->{version} =~ $semver, "provides.$ext.version is a semantic version");
		check(!exists $e->{abstract} || is_string($e->{abstract}), "provides.$ext.abstract is a string");
		check(!exists $e->{docfile} || (is_path($e->{docfile}) && -e $e->{docfile}),
			"provides.$ext.docfile is an existing relative path") if exists $e->{docfile};
		check(!defined only_keys($e, qw(file version abstract docfile)), "provides.$ext has no unknown keys",
			only_keys($e, qw(file version abstract docfile)));
	}
}

my $ms = $meta->{'meta-spec'};
check(ref $ms eq 'HASH' && is_string($ms->{version}) && $ms->{version} =~ /^1\.0\.\d+$/,
	'meta-spec.version is 1.0.x');
check(ref $ms eq 'HASH' && (!exists $ms->{url} || $ms->{url} =~ m{^https?://pgxn\.org/meta/spec\.txt$}),
	'meta-spec.url is the spec\'s address');

check(!exists $meta->{description} || is_string($meta->{description}), 'description is a string');
check(!exists $meta->{generated_by} || is_string($meta->{generated_by}), 'generated_by is a string');
check(!exists $meta->{release_status} || $meta->{release_status} =~ /^(stable|testing|unstable)$/,
	'release_status is stable, testing or unstable');
if (exists $meta->{tags})
{
	my $t = $meta->{tags};
	check(ref $t eq 'ARRAY' && @$t && !(grep { !is_string($_) || length $_ > 255 || m{[/\\[:cntrl:]]} } @$t),
		'tags is a list of tags');
}
if (exists $meta->{prereqs})
{
	my $pr = $meta->{prereqs};
	my $ok = ref $pr eq 'HASH' && %$pr && !defined only_keys($pr, qw(configure build test runtime develop));
	for my $phase (grep { !custom($_) } keys %{ ref $pr eq 'HASH' ? $pr : {} })
	{
		my $ph = $pr->{$phase};
		$ok &&= ref $ph eq 'HASH' && !defined only_keys($ph, qw(requires recommends suggests conflicts));
		for my $rel (grep { !custom($_) } keys %{ ref $ph eq 'HASH' ? $ph : {} })
		{
			my $r = $ph->{$rel};
			$ok &&= ref $r eq 'HASH' && !grep { $_ !~ $term || !version_range($r->{$_}) } keys %$r;
		}
	}
	check($ok, 'prereqs maps phases and relationships to version ranges');
}
if (exists $meta->{resources})
{
	my $r = $meta->{resources};
	check(ref $r eq 'HASH' && %$r && !defined only_keys($r, qw(homepage bugtracker repository)),
		'resources has only homepage, bugtracker and repository');
}
if (exists $meta->{no_index})
{
	my $ni = $meta->{no_index};
	check(ref $ni eq 'HASH' && !defined only_keys($ni, qw(file directory)), 'no_index has only file and directory');
}

# The version is written once, in the control file; META.json must agree.
if (defined $control)
{
	my $ctl = do { local $/; open(my $fh, '<', $control) or die "$control: $!\n"; <$fh> };
	my ($dv) = $ctl =~ /^default_version\s*=\s*'([^']*)'/m;
	check(defined $dv && $meta->{version} eq $dv, "version equals the default_version of $control",
		"META.json has $meta->{version}, the control file " . ($dv // 'none'));
	my ($ext) = $control =~ m{([^/]+)\.control$};
	check(ref $p eq 'HASH' && ref $p->{$ext} eq 'HASH' && ($p->{$ext}{version} // '') eq ($dv // ''),
		"provides.$ext.version equals default_version");
}

print "# $failed of $n checks failed\n" if $failed;
exit($failed ? 1 : 0);
