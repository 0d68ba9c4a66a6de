#!/usr/bin/perl
# typedef-names.pl - print the names every "typedef" in the given C files
# declares, one per line, sorted, for checking tools/typedefs.list
# (scripts/pgindent.sh --typedefs).
#
#     perl tools/typedef-names.pl src/*.c src/*.h test/unit/*.c
use strict;
use warnings;

my %names;
foreach my $file (@ARGV)
{
	open(my $fh, '<', $file) or die "typedef-names.pl: $file: $!\n";
	local $/;
	my $text = <$fh>;
	close($fh);
	$text =~ s{/\*.*?\*/}{ }gs;    # comments
	$text =~ s{//[^\n]*}{ }g;
	$text =~ s{"(?:\\.|[^"\\])*"}{""}g;    # strings
	while ($text =~ /\btypedef\b/g)
	{
		my $start = pos($text);
		my $depth = 0;
		my $i;
		for ($i = $start; $i < length($text); $i++)
		{
			my $c = substr($text, $i, 1);
			$depth++ if $c eq '{' || $c eq '(';
			$depth-- if $c eq '}' || $c eq ')';
			last if $c eq ';' && $depth == 0;
		}
		my $decl = substr($text, $start, $i - $start);
		pos($text) = $i;
		if ($decl =~ /\(\s*\*\s*(\w+)\s*\)\s*\(/)
		{
			$names{$1} = 1;    # a pointer to a function
		}
		else
		{
			$decl =~ s/\[[^\]]*\]\s*$//;    # an array's dimension
			$names{$1} = 1 if $decl =~ /(\w+)\s*$/;
		}
	}
}
print "$_\n" foreach sort keys %names;
