set terminal pngcairo size 1000,600 font ",10"
set output "/work/main/bench/results/netlab/throughput.png"
set title "netlab: throughput vs link bandwidth (delay none ms, M=4)"
set grid
set key top left
set ylabel "tokens/s"
set xlabel "bandwidth per link"
set logscale y
set datafile missing "NaN"
plot for [i=2:5] "/work/main/bench/results/netlab/throughput.dat" using 0:i:xtic(1) with linespoints lw 2 pt 7 title columnheader(i)
set terminal pngcairo size 2200,450 font ",10"
set output "/work/main/bench/results/netlab/loss.png"
unset logscale
set multiplot layout 1,5 title "netlab: training loss vs wall-clock time per codec"
set key top right
set xlabel "wall-clock time (s)"
set ylabel "loss"
set title "unthrottled"
plot "/work/main/bench/results/netlab/curves/p0.dat" using 3:2 with lines lw 1.5 title "fp32 / fp32", "/work/main/bench/results/netlab/curves/p1.dat" using 3:2 with lines lw 1.5 title "fp16 / fp16", "/work/main/bench/results/netlab/curves/p2.dat" using 3:2 with lines lw 1.5 title "tah / fixpt:bits=8", "/work/main/bench/results/netlab/curves/p3.dat" using 3:2 with lines lw 1.5 title "tah / fixpt:bits=6"
set title "50 Mbit/s"
plot "/work/main/bench/results/netlab/curves/p4.dat" using 3:2 with lines lw 1.5 title "fp32 / fp32", "/work/main/bench/results/netlab/curves/p5.dat" using 3:2 with lines lw 1.5 title "fp16 / fp16", "/work/main/bench/results/netlab/curves/p6.dat" using 3:2 with lines lw 1.5 title "tah / fixpt:bits=8", "/work/main/bench/results/netlab/curves/p7.dat" using 3:2 with lines lw 1.5 title "tah / fixpt:bits=6"
set title "100 Mbit/s"
plot "/work/main/bench/results/netlab/curves/p8.dat" using 3:2 with lines lw 1.5 title "fp32 / fp32", "/work/main/bench/results/netlab/curves/p9.dat" using 3:2 with lines lw 1.5 title "fp16 / fp16", "/work/main/bench/results/netlab/curves/p10.dat" using 3:2 with lines lw 1.5 title "tah / fixpt:bits=8", "/work/main/bench/results/netlab/curves/p11.dat" using 3:2 with lines lw 1.5 title "tah / fixpt:bits=6"
set title "300 Mbit/s"
plot "/work/main/bench/results/netlab/curves/p12.dat" using 3:2 with lines lw 1.5 title "fp32 / fp32", "/work/main/bench/results/netlab/curves/p13.dat" using 3:2 with lines lw 1.5 title "fp16 / fp16", "/work/main/bench/results/netlab/curves/p14.dat" using 3:2 with lines lw 1.5 title "tah / fixpt:bits=8", "/work/main/bench/results/netlab/curves/p15.dat" using 3:2 with lines lw 1.5 title "tah / fixpt:bits=6"
set title "1000 Mbit/s"
plot "/work/main/bench/results/netlab/curves/p16.dat" using 3:2 with lines lw 1.5 title "fp32 / fp32", "/work/main/bench/results/netlab/curves/p17.dat" using 3:2 with lines lw 1.5 title "fp16 / fp16", "/work/main/bench/results/netlab/curves/p18.dat" using 3:2 with lines lw 1.5 title "tah / fixpt:bits=8", "/work/main/bench/results/netlab/curves/p19.dat" using 3:2 with lines lw 1.5 title "tah / fixpt:bits=6"
unset multiplot
